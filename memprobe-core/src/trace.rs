//! Trace: fastai's GPUMemTrace, generalised to any set of sources.
//!
//! A trace measures from its start: *delta used* and *delta peaked* per
//! source (see [`deltas`](crate::delta::deltas)). It supports start / stop /
//! reset / data / report / report_n_reset, a context label and a per-report
//! note, silent mode, and a scoped guard that reports on exit. Reports go to
//! the writer the caller chooses (standard error by default), never standard
//! output by surprise.

use crate::delta::{b2mb_signed, SourceDelta};
use crate::error::{Error, Result};
use crate::record::Record;
use crate::sample::monotonic_ns;
use crate::sink::Sink;
use crate::source::Source;
use crate::window::Window;
use std::io::Write;
use std::sync::Arc;

/// How a trace is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceOptions {
    /// The context shown in every report line (`(ctx: note)`).
    pub ctx: Option<String>,
    /// Do not print reports (data and sinks still work).
    pub silent: bool,
    /// Report with the note `exit` when a [`TraceGuard`] ends.
    pub on_exit_report: bool,
    /// Start measuring at creation (fastai does).
    pub start: bool,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            ctx: None,
            silent: false,
            on_exit_report: true,
            start: true,
        }
    }
}

enum State {
    NeverStarted,
    Running(Window),
    Stopped {
        data: Vec<SourceDelta>,
        started_at_ns: u64,
        stopped_at_ns: u64,
    },
}

/// Measures delta used and delta peaked of a set of sources.
///
/// # Example
///
/// ```
/// use memprobe_core::{Source, Trace, TraceOptions};
///
/// # fn main() -> memprobe_core::Result<()> {
/// let options = TraceOptions {
///     ctx: Some("load".into()),
///     silent: true, // print nothing; report() still returns the line
///     ..TraceOptions::default()
/// };
/// let mut trace = Trace::new(&[Source::process()?], options)?;
/// let data = vec![1u8; 32 << 20]; // kept: 32 MiB more in use
/// let line = trace.report(Some("after load"))?;
/// assert!(line.starts_with("△Used Peaked MB:"));
/// assert!(line.ends_with("(load: after load)"));
/// let d = &trace.data()?[0];
/// assert!(d.used_end >= d.used_start + (24 << 20), "{d:?}");
/// assert!(d.delta_used >= 24 << 20);
///
/// // Scoped use: the guard reports (note `exit`) when it goes out of scope.
/// let guard = trace.guard();
/// assert!(guard.is_running());
/// drop(guard);
/// drop(data);
/// # Ok(())
/// # }
/// ```
pub struct Trace {
    sources: Vec<Source>,
    state: State,
    ctx: Option<String>,
    silent: bool,
    on_exit_report: bool,
    out: Box<dyn Write + Send>,
    sinks: Vec<Arc<dyn Sink>>,
}

impl Trace {
    /// A trace over `sources` (at least one).
    pub fn new(sources: &[Source], options: TraceOptions) -> Result<Trace> {
        if sources.is_empty() {
            return Err(Error::invalid("a trace needs at least one source"));
        }
        if let Some(ctx) = &options.ctx {
            check_text(ctx, "ctx")?;
        }
        let mut t = Trace {
            sources: sources.to_vec(),
            state: State::NeverStarted,
            ctx: options.ctx,
            silent: options.silent,
            on_exit_report: options.on_exit_report,
            out: Box::new(crate::fd_write::FdWriter::stderr()),
            sinks: Vec::new(),
        };
        if options.start {
            t.start()?;
        }
        Ok(t)
    }

    /// The sources, in order.
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// Whether the trace is measuring.
    pub fn is_running(&self) -> bool {
        matches!(self.state, State::Running(_))
    }

    /// Starts measuring. Error if already running.
    pub fn start(&mut self) -> Result<()> {
        if self.is_running() {
            return Err(Error::wrong_order("trace is already running"));
        }
        self.state = State::Running(Window::open(&self.sources)?);
        Ok(())
    }

    /// Stops measuring and freezes the data. Error if not running.
    pub fn stop(&mut self) -> Result<()> {
        let State::Running(w) = &self.state else {
            return Err(Error::wrong_order(
                "trace is not running (stop before start, or stopped twice)",
            ));
        };
        let started_at_ns = w.started_at_ns();
        let data = w.measure()?;
        self.state = State::Stopped {
            data,
            started_at_ns,
            stopped_at_ns: monotonic_ns(),
        };
        Ok(())
    }

    /// Restarts the counters of a running trace. Error if not running.
    pub fn reset(&mut self) -> Result<()> {
        match &mut self.state {
            State::Running(w) => w.reset().map(drop),
            _ => Err(Error::wrong_order(
                "trace is not running; start it instead of resetting",
            )),
        }
    }

    /// Per source: used at start and now, peak, delta used, delta peaked.
    /// A stopped trace returns what it measured when it stopped.
    pub fn data(&self) -> Result<Vec<SourceDelta>> {
        match &self.state {
            State::Running(w) => w.measure(),
            State::Stopped { data, .. } => Ok(data.clone()),
            State::NeverStarted => Err(Error::wrong_order("trace was never started")),
        }
    }

    /// Suppresses (or restores) printed reports.
    pub fn set_silent(&mut self, silent: bool) {
        self.silent = silent;
    }

    /// Whether reports are suppressed.
    pub fn is_silent(&self) -> bool {
        self.silent
    }

    /// Sends printed reports to `out` instead of standard error.
    pub fn set_output(&mut self, out: Box<dyn Write + Send>) {
        self.out = out;
    }

    /// Also sends a [`Record`] of every report to `sink`.
    pub fn add_sink(&mut self, sink: Arc<dyn Sink>) {
        self.sinks.push(sink);
    }

    /// The context label.
    pub fn ctx(&self) -> Option<&str> {
        self.ctx.as_deref()
    }

    /// The report line for `note` (without newline), neither printed nor
    /// sent to sinks.
    pub fn line(&self, note: Option<&str>) -> Result<String> {
        if let Some(n) = note {
            check_text(n, "note")?;
        }
        Ok(format_report(
            &self.data()?,
            &context(self.ctx.as_deref(), note),
        ))
    }

    /// Reports delta used / delta peaked with an optional note: prints the
    /// line (unless silent), sends a record to the sinks, returns the line
    /// (without newline).
    pub fn report(&mut self, note: Option<&str>) -> Result<String> {
        if let Some(n) = note {
            check_text(n, "note")?;
        }
        let data = self.data()?;
        let (started, ended) = match &self.state {
            State::Running(w) => (w.started_at_ns(), monotonic_ns()),
            State::Stopped {
                started_at_ns,
                stopped_at_ns,
                ..
            } => (*started_at_ns, *stopped_at_ns),
            State::NeverStarted => unreachable!("data() failed above"),
        };
        let label = context(self.ctx.as_deref(), note);
        let line = format_report(&data, &label);
        if !self.sinks.is_empty() {
            let record = Record::new(label, started, ended, data);
            for s in &self.sinks {
                s.on_record(&record);
            }
        }
        if !self.silent {
            writeln!(self.out, "{line}")
                .and_then(|_| self.out.flush())
                .map_err(|e| Error::io("write the trace report", &e))?;
        }
        Ok(line)
    }

    /// [`report`](Self::report), then [`reset`](Self::reset).
    pub fn report_n_reset(&mut self, note: Option<&str>) -> Result<String> {
        if !self.is_running() {
            return Err(Error::wrong_order("report_n_reset needs a running trace"));
        }
        let line = self.report(note)?;
        self.reset()?;
        Ok(line)
    }

    /// A guard that reports with the note `exit` when dropped (if
    /// `on_exit_report`), like fastai's context manager.
    pub fn guard(self) -> TraceGuard {
        TraceGuard { trace: Some(self) }
    }

    fn exit_report(&mut self) {
        if self.on_exit_report && self.is_running() {
            let _ = self.report(Some("exit"));
        }
    }
}

/// Reports on scope exit; derefs to the [`Trace`].
pub struct TraceGuard {
    trace: Option<Trace>,
}

impl TraceGuard {
    /// Ends the scope without the exit report, returning the trace.
    pub fn into_inner(mut self) -> Trace {
        self.trace.take().expect("present until drop")
    }
}

impl std::ops::Deref for TraceGuard {
    type Target = Trace;
    fn deref(&self) -> &Trace {
        self.trace.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for TraceGuard {
    fn deref_mut(&mut self) -> &mut Trace {
        self.trace.as_mut().expect("present until drop")
    }
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        if let Some(t) = self.trace.as_mut() {
            t.exit_report();
        }
    }
}

fn check_text(s: &str, what: &str) -> Result<()> {
    if s.len() > 4096 {
        return Err(Error::invalid(format!("{what} is longer than 4096 bytes")));
    }
    Ok(())
}

/// fastai's context: `ctx`, `note`, or `ctx: note`; empty when neither.
pub(crate) fn context(ctx: Option<&str>, note: Option<&str>) -> String {
    let parts: Vec<&str> = [ctx, note]
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .collect();
    parts.join(": ")
}

/// The report line. One source: exactly fastai's
/// `△Used Peaked MB: {used:6,} {peaked:6,} (ctx: note)`; several sources:
/// one `name used peaked` group per source, separated by ` | `.
pub(crate) fn format_report(data: &[SourceDelta], label: &str) -> String {
    let mut line = String::from("△Used Peaked MB:");
    match data {
        [one] => {
            line.push_str(&format!(
                " {:>6} {:>6}",
                group(b2mb_signed(one.delta_used)),
                group(mb(one.delta_peaked))
            ));
        }
        many => {
            for (i, d) in many.iter().enumerate() {
                if i > 0 {
                    line.push_str(" |");
                }
                line.push_str(&format!(
                    " {} {:>6} {:>6}",
                    d.name,
                    group(b2mb_signed(d.delta_used)),
                    group(mb(d.delta_peaked))
                ));
            }
        }
    }
    if !label.is_empty() {
        line.push_str(&format!(" ({label})"));
    }
    line
}

fn mb(bytes: u64) -> i64 {
    i64::try_from(bytes >> 20).unwrap_or(i64::MAX)
}

/// Thousands separators, like Python's `{:,}`.
fn group(v: i64) -> String {
    let digits = v.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if v < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{PeakFidelity, SourceKind};

    fn d(name: &str, used: i64, peaked: u64) -> SourceDelta {
        SourceDelta {
            name: name.into(),
            kind: SourceKind::Custom,
            fidelity: PeakFidelity::Pushed,
            used_start: 0,
            used_end: 0,
            peak: 0,
            delta_used: used,
            delta_peaked: peaked,
        }
    }

    #[test]
    fn report_line_matches_fastai() {
        assert_eq!(
            format_report(&[d("x", 0, 0)], ""),
            "△Used Peaked MB:      0      0"
        );
        assert_eq!(
            format_report(&[d("x", 0, 0)], &context(None, Some("i=0"))),
            "△Used Peaked MB:      0      0 (i=0)"
        );
        assert_eq!(
            format_report(&[d("x", 0, 0)], &context(Some("foobar"), Some("1st try"))),
            "△Used Peaked MB:      0      0 (foobar: 1st try)"
        );
        assert_eq!(
            format_report(&[d("x", 1234 << 20, 5 << 20)], ""),
            "△Used Peaked MB:  1,234      5"
        );
        assert_eq!(
            format_report(&[d("x", -(3 << 20), 0)], ""),
            "△Used Peaked MB:     -3      0"
        );
        assert_eq!(
            format_report(&[d("rss", 1 << 20, 0), d("gpu0", 0, 2 << 20)], "t"),
            "△Used Peaked MB: rss      1      0 | gpu0      0      2 (t)"
        );
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(group(-1000), "-1,000");
        assert_eq!(group(999), "999");
    }
}
