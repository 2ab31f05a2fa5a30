//! Built-in sinks: a PeakMemMetric-style table, JSON Lines and CSV.

mod atomic_file;
mod csv;
pub(crate) mod json;
mod jsonl;
mod table;

pub use self::csv::{CsvSink, CSV_HEADER};
pub use atomic_file::AtomicFile;
pub use jsonl::JsonlSink;
pub use table::TableSink;
