//! Training-loop phases: step, epoch, experience, stream, and named custom
//! phases, with the nesting rules that keep records meaningful.

use crate::error::{Error, Result};

/// A phase of the training loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum PhaseKind {
    /// One minibatch / iteration.
    Step = 0,
    /// One pass over the training data.
    Epoch = 1,
    /// One experience (Avalanche: a training or evaluation task).
    Experience = 2,
    /// One evaluation pass over a stream of experiences.
    Stream = 3,
    /// A phase named by the caller (e.g. "forward", "checkpoint").
    Custom = 4,
}

impl PhaseKind {
    /// From the C value; unknown values are rejected.
    pub fn from_u32(v: u32) -> Result<PhaseKind> {
        Ok(match v {
            0 => PhaseKind::Step,
            1 => PhaseKind::Epoch,
            2 => PhaseKind::Experience,
            3 => PhaseKind::Stream,
            4 => PhaseKind::Custom,
            other => return Err(Error::invalid(format!("unknown phase kind {other}"))),
        })
    }

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
