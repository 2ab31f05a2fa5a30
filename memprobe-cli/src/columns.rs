//! Text tables for people: left-aligned columns, two spaces apart.

use std::fmt::Write as _;

/// Renders `rows` (the first one being the header) as aligned columns; the
/// last cell of a row is not padded and no line has trailing spaces.
pub(crate) fn render_rows<R: AsRef<[String]>>(rows: &[R]) -> String {
    render_indented(rows, "")
}

/// [`render_rows`], each line after `indent`. A row of one cell in a table
/// of several columns is a note: it spans the table and sets no width.
pub(crate) fn render_indented<R: AsRef<[String]>>(rows: &[R], indent: &str) -> String {
    let cols = rows.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
    let mut widths = vec![0usize; cols];
    for r in rows.iter().map(AsRef::as_ref).filter(|r| r.len() > 1) {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows.iter().map(AsRef::as_ref) {
        let mut line = String::from(indent);
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_by_characters() {
        let rows = [
            ["A".to_string(), "B".into(), "C".into()],
            ["µµµ".to_string(), "".into(), "x".into()],
        ];
        assert_eq!(render_rows(&rows), "A    B  C\nµµµ     x\n");
    }

    #[test]
    fn a_note_spans_the_table_and_sets_no_width() {
        let rows = vec![
            vec!["PHASE".to_string(), "PEAK".into(), "STEPS".into()],
            vec!["... 12 phases not shown".to_string()],
            vec!["epoch 0".to_string(), "1.00 GiB".into(), "10".into()],
        ];
        assert_eq!(
            render_indented(&rows, "  "),
            "  PHASE    PEAK      STEPS\n  ... 12 phases not shown\n  epoch 0  1.00 GiB  10\n"
        );
    }
}
