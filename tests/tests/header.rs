//! include/memprobe.h is exactly what cbindgen generates from memprobe-ffi-impl,
//! compiles alone and twice-included as C99 and C++17 with strict warnings,
//! and its version macros match Cargo.toml.

use memprobe_tests::{root, scratch, STRICT};
use std::process::Command;

fn generate() -> String {
    let crate_dir = root().join("memprobe-ffi-impl");
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("utf-8 header")
}

#[test]
fn header_is_up_to_date() {
    let generated = generate();
    let path = root().join("include/memprobe.h");
    if std::env::var_os("MEMPROBE_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write header");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/memprobe.h differs from what cbindgen generates; run `make header` (MEMPROBE_BLESS=1 cargo test -p memprobe-tests --test header) and commit it"
    );
}

#[test]
fn header_compiles_alone_and_twice_included() {
    let dir = scratch("header");
    let include = root().join("include");
    for (lang, ext, std) in [("c", "c", "-std=c99"), ("c++", "cpp", "-std=c++17")] {
        let src = dir.join(format!("twice.{ext}"));
        std::fs::write(&src, "#include \"memprobe.h\"\n#include \"memprobe.h\"\nint main(void) { return MEMPROBE_STATUS_OK; }\n").unwrap();
        let compiler = if lang == "c" { "cc" } else { "c++" };
        let o = Command::new(compiler)
            .arg(std)
            .args(STRICT)
            .arg("-I")
            .arg(&include)
            .arg(&src)
            .arg("-fsyntax-only")
            .output()
            .expect("run compiler");
        assert!(
            o.status.success(),
            "{lang}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn cpp_header_compiles_alone_and_twice_included() {
    let dir = scratch("hpp");
    let src = dir.join("twice.cpp");
    std::fs::write(&src, "#include \"memprobe.hpp\"\n#include \"memprobe.hpp\"\nint main() { return memprobe::b2mb(0) == 0 ? 0 : 1; }\n").unwrap();
    let o = Command::new("c++")
        .arg("-std=c++17")
        .args(STRICT)
        .arg("-I")
        .arg(root().join("include"))
        .arg(&src)
        .arg("-fsyntax-only")
        .output()
        .expect("run c++");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn version_macros_match_cargo_toml() {
    let header = std::fs::read_to_string(root().join("include/memprobe.h")).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let parts: Vec<&str> = version.split('.').collect();
    for (name, want) in ["MAJOR", "MINOR", "PATCH"].iter().zip(parts) {
        let line = format!("#define MEMPROBE_VERSION_{name} {want}");
        assert!(header.contains(&line), "header lacks `{line}`");
    }
}

#[test]
fn every_function_is_documented_in_the_header() {
    let header = std::fs::read_to_string(root().join("include/memprobe.h")).unwrap();
    let lines: Vec<&str> = header.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let is_decl = (l.starts_with("memprobe_status memprobe_")
            || l.starts_with("const char *memprobe_")
            || l.starts_with("uint64_t memprobe_"))
            && l.contains('(');
        if is_decl {
            let prev = lines[..i]
                .iter()
                .rev()
                .find(|p| !p.trim().is_empty())
                .copied()
                .unwrap_or("");
            assert!(
                prev.trim_end().ends_with("*/"),
                "undocumented declaration: {l}"
            );
        }
    }
}
