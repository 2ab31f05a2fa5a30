//! The Prometheus text exposition format (version 0.0.4), which OpenMetrics
//! parsers and every Prometheus release accept.
//!
//! Written by hand rather than with an encoding crate: the DCGM-compatible
//! families need upper-case metric names and camel-case label names
//! (`modelName`, `UUID`) beside memprobe's own, counters must be TYPEd under
//! the very name their samples carry (so that `promtool check metrics` and
//! classic text parsers keep their type and help), and values are rendered
//! at scrape time from a snapshot, not kept in registered metric objects.
//! The format is a handful of rules, all enforced here: valid names, escaped
//! label values and help text, one HELP/TYPE per family, families never
//! interleaved.

use std::fmt::Write;

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Type {
    Gauge,
    Counter,
}

/// Builds one exposition. Families are written whole, one after another.
#[derive(Debug, Default)]
pub(crate) struct Exposition {
    out: String,
}

/// A label set: name and value pairs, names valid label names.
pub(crate) type Labels<'a> = [(&'a str, &'a str)];

impl Exposition {
    pub(crate) fn new() -> Self {
        Exposition {
            out: String::with_capacity(4096),
        }
    }

    /// Starts a family: `# HELP` and `# TYPE`. Samples written next belong to it.
    pub(crate) fn family(&mut self, name: &str, help: &str, ty: Type) {
        debug_assert!(valid_metric_name(name), "{name}");
        debug_assert!(ty != Type::Counter || name.ends_with("_total"), "{name}");
        let _ = write!(self.out, "# HELP {name} ");
        for c in help.chars() {
            match c {
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                c => self.out.push(c),
            }
        }
        let ty = match ty {
            Type::Gauge => "gauge",
            Type::Counter => "counter",
        };
        let _ = writeln!(self.out, "\n# TYPE {name} {ty}");
    }

    /// One sample of the current family, with `common` labels after `labels`.
    pub(crate) fn sample(&mut self, name: &str, labels: &Labels<'_>, common: &Labels<'_>, v: f64) {
        self.out.push_str(name);
        let mut first = true;
        for (k, val) in labels.iter().chain(common) {
            debug_assert!(valid_label_name(k), "{k}");
            self.out.push(if first { '{' } else { ',' });
            first = false;
            self.out.push_str(k);
            self.out.push_str("=\"");
            for c in val.chars() {
                match c {
                    '\\' => self.out.push_str("\\\\"),
                    '"' => self.out.push_str("\\\""),
                    '\n' => self.out.push_str("\\n"),
                    c => self.out.push(c),
                }
            }
            self.out.push('"');
        }
        if !first {
            self.out.push('}');
        }
        self.out.push(' ');
        if v.is_nan() {
            self.out.push_str("NaN");
        } else if v.is_infinite() {
            self.out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
        } else {
            let _ = write!(self.out, "{v}");
        }
        self.out.push('\n');
    }

    /// The text.
    pub(crate) fn finish(self) -> String {
        self.out
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
pub(crate) fn valid_metric_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_' || c == b':')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__` (reserved).
pub(crate) fn valid_label_name(s: &str) -> bool {
    let mut b = s.bytes();
    !s.starts_with("__")
        && matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_formats() {
        let mut e = Exposition::new();
        e.family("a_bytes", "line\\one\ntwo", Type::Gauge);
        e.sample("a_bytes", &[("x", "q\"\\\n")], &[("h", "n")], 1.5e9);
        e.sample("a_bytes", &[], &[], -3.0);
        e.family("c_total", "c", Type::Counter);
        e.sample("c_total", &[], &[], f64::INFINITY);
        assert_eq!(
            e.finish(),
            "# HELP a_bytes line\\\\one\\ntwo\n# TYPE a_bytes gauge\n\
             a_bytes{x=\"q\\\"\\\\\\n\",h=\"n\"} 1500000000\na_bytes -3\n\
             # HELP c_total c\n# TYPE c_total counter\nc_total +Inf\n"
        );
    }

    #[test]
    fn names() {
        assert!(valid_metric_name("DCGM_FI_DEV_FB_USED"));
        assert!(valid_metric_name("memprobe:x_1"));
        assert!(!valid_metric_name("1x") && !valid_metric_name("") && !valid_metric_name("a-b"));
        assert!(valid_label_name("modelName") && valid_label_name("_x"));
        assert!(!valid_label_name("__name__") && !valid_label_name("a:b"));
    }
}
