//! Every function declared in include/memprobe.h is bound by every language
//! binding (named in its sources) or listed in the binding's UNBOUND.txt
//! (`function_name: reason`) — so the header cannot grow without the
//! bindings following, or saying why not.

use memprobe_tests::root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The functions a C header declares: top-level declarations whose
/// identifier before `(` starts with `memprobe_` (typedefs, macros, comments
/// and struct fields excluded).
fn declared_functions(header: &str) -> BTreeSet<String> {
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
fn mentions(text: &str, ident: &str) -> bool {
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

/// `function_name: reason` lines; `#` starts a comment line.
fn parse_unbound(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, reason) = line
            .split_once(':')
            .ok_or_else(|| format!("line {}: expected `function_name: reason`", n + 1))?;
        let (name, reason) = (name.trim(), reason.trim());
        if reason.is_empty() {
            return Err(format!("line {}: {name} has no reason", n + 1));
        }
        if out.insert(name.to_owned(), reason.to_owned()).is_some() {
            return Err(format!("line {}: {name} listed twice", n + 1));
        }
    }
    Ok(out)
}

fn collect(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if !name.starts_with('.') && name != "__pycache__" && name != "tests" {
                collect(&p, keep, out);
            }
        } else if keep(&p) {
            out.push(p);
        }
    }
}

struct Binding {
    name: &'static str,
    dir: &'static str,
    /// Where the binding's code lives, relative to `dir` (tests excluded).
    code: &'static [&'static str],
    keep: fn(&Path) -> bool,
}

fn ext(p: &Path, exts: &[&str]) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| exts.contains(&e))
}

const BINDINGS: &[Binding] = &[
    Binding {
        name: "Python",
        dir: "bindings/python",
        code: &["memprobe"],
        keep: |p| ext(p, &["py"]),
    },
    Binding {
        name: "Go",
        dir: "bindings/go",
        code: &["."],
        keep: |p| {
            ext(p, &["go", "c"])
                && !p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with("_test.go"))
        },
    },
    Binding {
        name: "Julia",
        dir: "bindings/julia",
        code: &["src"],
        keep: |p| ext(p, &["jl"]),
    },
];

/// What is wrong with one binding, or nothing.
fn check_binding(b: &Binding, functions: &BTreeSet<String>) -> Vec<String> {
    let dir = root().join(b.dir);
    let mut files = Vec::new();
    for c in b.code {
        collect(&dir.join(c), &b.keep, &mut files);
    }
    if files.is_empty() {
        return vec![format!("{}: no source files under {}", b.name, b.dir)];
    }
    let text: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let unbound_path = dir.join("UNBOUND.txt");
    let unbound = match std::fs::read_to_string(&unbound_path) {
        Ok(t) => match parse_unbound(&t) {
            Ok(u) => u,
            Err(e) => return vec![format!("{}: {}", unbound_path.display(), e)],
        },
        Err(_) => BTreeMap::new(),
    };
    let mut problems = Vec::new();
    for f in functions {
        let bound = mentions(&text, f);
        match (bound, unbound.contains_key(f)) {
            (false, false) => problems.push(format!(
                "{}: {f} is neither bound in {} nor listed in {}/UNBOUND.txt with a reason",
                b.name, b.dir, b.dir
            )),
            (true, true) => problems.push(format!(
                "{}: {f} is bound but still listed in {}/UNBOUND.txt",
                b.name, b.dir
            )),
            _ => {}
        }
    }
    for f in unbound.keys() {
        if !functions.contains(f) {
            problems.push(format!(
                "{}: {}/UNBOUND.txt lists {f}, which is not in include/memprobe.h",
                b.name, b.dir
            ));
        }
    }
    problems
}

#[test]
fn every_header_function_is_bound_or_listed_with_a_reason() {
    let header = std::fs::read_to_string(root().join("include/memprobe.h")).unwrap();
    let functions = declared_functions(&header);
    assert!(
        functions.len() > 30 && functions.contains("memprobe_window_open"),
        "the header parser found {functions:?}"
    );
    let problems: Vec<String> = BINDINGS
        .iter()
        .flat_map(|b| check_binding(b, &functions))
        .collect();
    assert!(
        problems.is_empty(),
        "{} problem(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

#[test]
fn header_parser_finds_functions_only() {
    let h = "\
#define MEMPROBE_X 1
typedef int32_t (*memprobe_read_fn)(void *user_data, uint64_t *out_bytes);
typedef struct memprobe_source memprobe_source;
/**
 * Calls memprobe_source_free(x) in a comment.
 */
const char *memprobe_version(void);
memprobe_status memprobe_source_new_callback(const char *name, memprobe_read_fn read, void *user_data, memprobe_source **out);
  uint64_t memprobe_not_a_field(void);
uint64_t memprobe_b2mb(uint64_t bytes);
";
    let got: Vec<String> = declared_functions(h).into_iter().collect();
    assert_eq!(
        got,
        [
            "memprobe_b2mb",
            "memprobe_source_new_callback",
            "memprobe_version"
        ]
    );
}

#[test]
fn mentions_are_whole_identifiers() {
    let text = "C.memprobe_trace_report_n_reset(h)";
    assert!(!mentions(text, "memprobe_trace_report"));
    assert!(mentions(text, "memprobe_trace_report_n_reset"));
    assert!(mentions(":memprobe_trace_report,", "memprobe_trace_report"));
}

#[test]
fn unbound_lists_need_reasons() {
    let ok = parse_unbound("# comment\nmemprobe_x: no GPU here\n\n").unwrap();
    assert_eq!(ok["memprobe_x"], "no GPU here");
    assert!(parse_unbound("memprobe_x:\n").is_err());
    assert!(parse_unbound("memprobe_x\n").is_err());
    assert!(parse_unbound("memprobe_x: a\nmemprobe_x: b\n").is_err());
}
