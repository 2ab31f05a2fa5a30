//! Text tables for people: left-aligned columns, two spaces apart.

use std::fmt::Write as _;

/// Renders `rows` (the first one being the header) as aligned columns; the
/// last column is not padded and no line has trailing spaces.
pub(crate) fn render_rows<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == N {
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
}
