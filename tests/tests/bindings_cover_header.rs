//! Every function declared in include/memprobe.h is bound by every language
//! binding (named in its sources) or listed in the binding's UNBOUND.txt
//! (`function_name: reason`) — so the header cannot grow without the
//! bindings following, or saying why not.

use memprobe_tests::c_header::{declared_functions, mentions};
use memprobe_tests::root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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

/// Integer constants of the header: `#define MEMPROBE_X <int>` and enum
/// members `MEMPROBE_X = <int>,`.
fn header_constants(header: &str) -> BTreeMap<String, i128> {
    let mut out = BTreeMap::new();
    for line in header.lines() {
        let t = line.trim();
        let (name, value) = if let Some(rest) = t.strip_prefix("#define ") {
            match rest.split_once(' ') {
                Some((n, v)) => (n, v.trim()),
                None => continue,
            }
        } else if let Some((n, v)) = t.split_once(" = ") {
            (n, v.trim_end_matches(','))
        } else {
            continue;
        };
        if let (true, Ok(v)) = (name.starts_with("MEMPROBE_"), value.parse::<i128>()) {
            out.insert(name.to_owned(), v);
        }
    }
    out
}

/// Field (type, name) lists of the header's `typedef struct { ... } NAME;`
/// structs; arrays as `char[72]`.
fn header_structs(header: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out = BTreeMap::new();
    let mut fields: Option<Vec<(String, String)>> = None;
    for line in header.lines() {
        if line.starts_with("typedef struct") && line.trim_end().ends_with('{') {
            fields = Some(Vec::new());
        } else if let Some(name) = line.strip_prefix("} ").and_then(|r| r.strip_suffix(';')) {
            if let Some(f) = fields.take() {
                out.insert(name.to_owned(), f);
            }
        } else if let Some(f) = fields.as_mut() {
            let t = line.trim();
            if t.starts_with('/') || t.starts_with('*') || !t.ends_with(';') {
                continue;
            }
            let decl = t.trim_end_matches(';');
            let Some((ty, name)) = decl.rsplit_once(' ') else {
                continue;
            };
            match name.split_once('[') {
                Some((n, len)) => f.push((format!("{ty}[{}", len), n.to_owned())),
                None => f.push((ty.to_owned(), name.to_owned())),
            }
        }
    }
    out
}

/// The C type a Julia field type stands for.
fn julia_to_c(ty: &str) -> Option<String> {
    let plain = match ty {
        "UInt64" => "uint64_t",
        "Int64" => "int64_t",
        "UInt32" => "uint32_t",
        "Int32" => "int32_t",
        "UInt16" => "uint16_t",
        "Bool" => "bool",
        _ => "",
    };
    if !plain.is_empty() {
        return Some(plain.to_owned());
    }
    let inner = ty.strip_prefix("NTuple{")?.strip_suffix(",UInt8}")?;
    Some(format!("char[{inner}]"))
}

/// What is wrong with MemProbe.jl's copies of the header, or nothing.
fn julia_problems(jl: &str, header: &str) -> Vec<String> {
    let consts = header_constants(header);
    let structs = header_structs(header);
    let mut problems = Vec::new();
    let int_of = |v: &str| -> Option<i128> {
        let v = v.trim();
        let inner = ["UInt32(", "Int32(", "UInt64(", "Int64("]
            .iter()
            .find_map(|p| v.strip_prefix(p).and_then(|r| r.strip_suffix(')')))
            .unwrap_or(v);
        inner.parse().ok()
    };
    let mut julia_statuses = BTreeSet::new();
    let mut symbol_tables = 0;
    let mut checked_structs = 0;
    let lines: Vec<&str> = jl.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        let at = format!("MemProbe.jl (its includes in place):{}", n + 1);
        let (code, comment) = match line.split_once('#') {
            Some((c, m)) => (c.trim(), Some(m.trim())),
            None => (line.trim(), None),
        };
        if let Some(rest) = code.strip_prefix("const ") {
            let Some((name, value)) = rest.split_once(" = ") else {
                continue;
            };
            if !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                continue;
            }
            // Tuples of symbols indexed from 0, and the phase dictionary.
            let symbol_prefix = match name {
                "KINDS" => Some("MEMPROBE_SOURCE_KIND_"),
                "FIDELITIES" => Some("MEMPROBE_FIDELITY_"),
                "GPU_BACKENDS" => Some("MEMPROBE_GPU_BACKEND_"),
                "PHASES" => Some("MEMPROBE_PHASE_KIND_"),
                _ => None,
            };
            if let Some(prefix) = symbol_prefix {
                symbol_tables += 1;
                // The value may continue on the next lines, up to the closing bracket.
                let mut text = value.to_owned();
                let mut k = n + 1;
                while text.matches('(').count() > text.matches(')').count() && k < lines.len() {
                    text.push_str(lines[k]);
                    k += 1;
                }
                let mut pairs = Vec::new();
                if name == "PHASES" {
                    for part in text.split(':').skip(1) {
                        let (sym, rest) = part.split_once("=>").unwrap_or((part, ""));
                        let v: String = rest
                            .trim()
                            .chars()
                            .take_while(char::is_ascii_digit)
                            .collect();
                        pairs.push((sym.trim().to_owned(), v.parse::<i128>().ok()));
                    }
                } else {
                    for (i, part) in text.split(':').skip(1).enumerate() {
                        let sym: String = part
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        pairs.push((sym, Some(i as i128)));
                    }
                }
                let julia_names: BTreeSet<String> = pairs
                    .iter()
                    .map(|(s, _)| format!("{prefix}{}", s.to_ascii_uppercase()))
                    .collect();
                for (sym, v) in &pairs {
                    let c = format!("{prefix}{}", sym.to_ascii_uppercase());
                    if consts.get(&c) != v.as_ref() {
                        problems.push(format!(
                            "{at}: {name} gives :{sym} the value {v:?}, the header's {c} is {:?}",
                            consts.get(&c)
                        ));
                    }
                }
                for c in consts.keys().filter(|c| c.starts_with(prefix)) {
                    if !julia_names.contains(c) {
                        problems.push(format!("{at}: {name} lacks the header's {c}"));
                    }
                }
                continue;
            }
            if name == "ABI" {
                let want = format!(
                    "({}, {})",
                    consts["MEMPROBE_VERSION_MAJOR"], consts["MEMPROBE_VERSION_MINOR"]
                );
                if value.trim() != want {
                    problems.push(format!("{at}: ABI is {value}, the header says {want}"));
                }
                continue;
            }
            let Some(v) = int_of(value) else { continue };
            let named = comment.filter(|c| c.starts_with("MEMPROBE_"));
            let candidates: Vec<String> = match named {
                Some(c) => vec![c.to_owned()],
                None => vec![
                    format!("MEMPROBE_STATUS_{name}"),
                    format!("MEMPROBE_{name}"),
                ],
            };
            match candidates.iter().find(|c| consts.contains_key(*c)) {
                Some(c) => {
                    if c.starts_with("MEMPROBE_STATUS_") {
                        julia_statuses.insert(c.clone());
                    }
                    if consts[c] != v {
                        problems.push(format!(
                            "{at}: {name} = {v}, the header's {c} is {}",
                            consts[c]
                        ));
                    }
                }
                None => problems.push(format!(
                    "{at}: {name} = {v} matches no header constant (tried {candidates:?})"
                )),
            }
        } else if let Some(rest) = code
            .strip_prefix("struct ")
            .or_else(|| code.strip_prefix("mutable struct "))
        {
            let Some(c_name) = comment
                .and_then(|c| c.strip_prefix("layout:"))
                .map(str::trim)
            else {
                continue;
            };
            checked_structs += 1;
            let Some(c_fields) = structs.get(c_name) else {
                problems.push(format!("{at}: {rest} names {c_name}, not a header struct"));
                continue;
            };
            let mut j_fields = Vec::new();
            for l in &lines[n + 1..] {
                let l = l.split('#').next().unwrap_or("").trim();
                if l == "end" {
                    break;
                }
                if let Some((f, ty)) = l.split_once("::") {
                    j_fields.push((julia_to_c(ty.trim()), f.trim().to_owned()));
                }
            }
            let want: Vec<(Option<String>, String)> = c_fields
                .iter()
                .map(|(t, f)| (Some(t.clone()), f.clone()))
                .collect();
            if j_fields != want {
                problems.push(format!(
                    "{at}: {rest} has fields {j_fields:?}, the header's {c_name} {want:?}"
                ));
            }
        }
    }
    for c in consts.keys().filter(|c| c.starts_with("MEMPROBE_STATUS_")) {
        if !julia_statuses.contains(c) {
            problems.push(format!("MemProbe.jl declares no constant for {c}"));
        }
    }
    if symbol_tables != 4 || checked_structs < 8 {
        problems.push(format!(
            "found {symbol_tables} symbol tables and {checked_structs} structs with a layout \
             comment in MemProbe.jl (want 4 and at least 8): the parser no longer matches it"
        ));
    }
    problems
}

/// MemProbe.jl with each `include("file.jl")` line replaced by that file
/// (the module is split into a file per concept, in src/).
fn julia_module_text() -> String {
    let src = root().join("bindings/julia/src");
    let module = std::fs::read_to_string(src.join("MemProbe.jl")).unwrap();
    let mut out = String::new();
    let mut included = 0;
    for line in module.lines() {
        let file = line
            .trim()
            .strip_prefix("include(\"")
            .and_then(|r| r.strip_suffix("\")"));
        match file {
            Some(f) => {
                let path = src.join(f);
                out += &std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("MemProbe.jl includes {}: {e}", path.display()));
                included += 1;
            }
            None => out += line,
        }
        out.push('\n');
    }
    assert!(
        included > 0,
        "MemProbe.jl includes no file: the reader no longer matches it"
    );
    out
}

#[test]
fn julia_constants_and_struct_layouts_match_the_header() {
    let header = std::fs::read_to_string(root().join("include/memprobe.h")).unwrap();
    let jl = julia_module_text();
    let problems = julia_problems(&jl, &header);
    assert!(
        problems.is_empty(),
        "{} problem(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

#[test]
fn julia_checker_catches_mistakes() {
    let header = "\
#define MEMPROBE_VERSION_MAJOR 0
#define MEMPROBE_VERSION_MINOR 1
#define MEMPROBE_TRACE_SILENT 1
  MEMPROBE_STATUS_OK = 0,
  MEMPROBE_STATUS_IO = 9,
  MEMPROBE_SOURCE_KIND_PROCESS = 0,
  MEMPROBE_FIDELITY_EXACT = 0,
  MEMPROBE_GPU_BACKEND_AUTO = 0,
  MEMPROBE_PHASE_KIND_STEP = 0,
typedef struct {
  /**
   * A comment; with a semicolon;
   */
  uint64_t used;
  char name[72];
} memprobe_x;
";
    let good = "\
const ABI = (0, 1)
const OK = UInt32(0)
const IO_ERROR = UInt32(9)  # MEMPROBE_STATUS_IO
const TRACE_SILENT = UInt32(1)
const KINDS = (:process,)
const FIDELITIES = (:exact,)
const GPU_BACKENDS = (:auto,)
const PHASES = Dict(:step => 0)
struct A  # layout: memprobe_x
    used::UInt64
    name::NTuple{72,UInt8}
end
";
    // Eight layout-checked structs are expected in the real file.
    let good8 = good.to_owned() + &good[good.find("struct A").unwrap()..].repeat(7);
    assert_eq!(julia_problems(&good8, header), Vec::<String>::new());
    for (from, to) in [
        ("const OK = UInt32(0)", "const OK = UInt32(1)"),
        ("  # MEMPROBE_STATUS_IO", ""),
        ("const IO_ERROR = UInt32(9)  # MEMPROBE_STATUS_IO\n", ""),
        ("(:process,)", "(:process, :tree)"),
        ("Dict(:step => 0)", "Dict(:step => 1)"),
        ("const ABI = (0, 1)", "const ABI = (0, 2)"),
        ("    used::UInt64\n    name", "    name"),
        ("used::UInt64", "used::UInt32"),
        ("NTuple{72,UInt8}", "NTuple{64,UInt8}"),
    ] {
        let bad = good8.replacen(from, to, 1);
        assert_ne!(bad, good8, "{from}");
        assert!(!julia_problems(&bad, header).is_empty(), "{from} -> {to}");
    }
}
