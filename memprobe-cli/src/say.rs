//! Messages on stderr that never end memprobe: `eprintln!` panics when
//! stderr is closed or a broken pipe (`memprobe run … 2>&1 | true`), which
//! would turn the command's exit status into 101 and lose the outputs not
//! yet written. A message that cannot be delivered is dropped instead.

use std::fmt;
use std::io::Write;

/// Writes `args` and a newline to stderr, ignoring any error.
pub(crate) fn line(args: fmt::Arguments) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_fmt(args).and_then(|()| e.write_all(b"\n"));
}

/// Writes `text` as is to stderr, ignoring any error.
pub(crate) fn text(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `eprintln!` that never panics (see the module's text).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::line(format_args!($($arg)*))
    };
}
pub(crate) use say;
