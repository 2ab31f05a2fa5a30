//! Training-loop phases: step, epoch, experience, stream, and named custom
//! phases, with the nesting rules that keep records meaningful.

/// A phase of the training loop. (Its C numbering belongs to the C ABI,
/// memprobe-ffi, not to this type.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PhaseKind {
    /// One minibatch / iteration.
    Step,
    /// One pass over the training data.
    Epoch,
    /// One experience (Avalanche: a training or evaluation task).
    Experience,
    /// One evaluation pass over a stream of experiences.
    Stream,
    /// A phase named by the caller (e.g. "forward", "checkpoint").
    Custom,
}

impl PhaseKind {
    /// Lowercase name (`step`, `epoch`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseKind::Step => "step",
            PhaseKind::Epoch => "epoch",
            PhaseKind::Experience => "experience",
            PhaseKind::Stream => "stream",
            PhaseKind::Custom => "custom",
        }
    }

    /// The kind [`as_str`](Self::as_str) names, if any.
    pub fn from_name(name: &str) -> Option<PhaseKind> {
        Some(match name {
            "step" => PhaseKind::Step,
            "epoch" => PhaseKind::Epoch,
            "experience" => PhaseKind::Experience,
            "stream" => PhaseKind::Stream,
            "custom" => PhaseKind::Custom,
            _ => return None,
        })
    }

    /// Nesting rank: a phase may only begin inside phases of a higher rank
    /// (custom phases have none and nest anywhere).
    pub(crate) fn rank(self) -> Option<u8> {
        match self {
            PhaseKind::Step => Some(0),
            PhaseKind::Epoch => Some(1),
            PhaseKind::Experience => Some(2),
            PhaseKind::Stream => Some(3),
            PhaseKind::Custom => None,
        }
    }
}

/// Which phase a record is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseInfo {
    /// The kind.
    pub kind: PhaseKind,
    /// The name: the kind's name, or the caller's for custom phases.
    pub name: String,
    /// 0-based count of phases of this kind (and name, for custom) ended
    /// before this one in the tracker: the step or epoch number.
    pub index: u64,
    /// How many phases enclosed it (0 = outermost).
    pub depth: u32,
}
