//! What include/memprobe.h declares, and whether a source text names or
//! calls it: the coverage checks of the bindings and of the ABI fuzzer.

use std::collections::BTreeSet;

/// The functions a C header declares: top-level declarations whose
/// identifier before `(` starts with `memprobe_` (typedefs, macros, comments
/// and struct fields excluded).
pub fn declared_functions(header: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in header.lines() {
        let first = line.chars().next();
        if !first.is_some_and(|c| c.is_ascii_alphabetic())
            || line.starts_with("typedef")
            || line.starts_with("enum")
            || line.starts_with("struct")
        {
            continue;
        }
        let Some(paren) = line.find('(') else {
            continue;
        };
        let before = line[..paren].trim_end();
        let name: String = before
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if name.starts_with("memprobe_") && name.len() < before.len() {
            out.insert(name);
        }
    }
    out
}

/// Whether `text` names `ident` as a whole identifier.
pub fn mentions(text: &str, ident: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(i) = text[from..].find(ident) {
        let start = from + i;
        let end = start + ident.len();
        let before_ok = !text[..start].chars().next_back().is_some_and(is_ident);
        let after_ok = !text[end..].chars().next().is_some_and(is_ident);
        if before_ok && after_ok {
            return true;
        }
        from = end;
    }
    false
}

/// Whether `text` calls `ident`: the whole identifier followed by `(`.
pub fn calls(text: &str, ident: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(i) = text[from..].find(ident) {
        let start = from + i;
        let end = start + ident.len();
        if !text[..start].chars().next_back().is_some_and(is_ident)
            && text[end..].trim_start().starts_with('(')
        {
            return true;
        }
        from = end;
    }
    false
}
