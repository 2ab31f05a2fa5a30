#!/usr/bin/env python3
"""Runs every fenced code block of README.md, CONTRIBUTING.md and docs/*.md
(``make test-docs``).

Every block is one of four things, and the harness counts each per file:

run
    A block in a language the harness runs, run as written:

    - ``sh`` / ``bash`` / ``shell``: by ``bash -e``, in the page's scratch
      directory (below);
    - ``python``: a fresh interpreter of the test venv, importing the
      package as ``make test-python`` installed it (MEMPROBE_PYTHON_SITE);
      ``ipython``: the same, through IPython's ``run_cell`` (``%magics``);
    - ``c`` / ``cpp``: compiled with ``-Wall -Wextra -Werror`` (C++:
      ``-std=c++17``) through the installed ``memprobe.pc``
      (``pkg-config --cflags --libs memprobe``), then run without
      LD_LIBRARY_PATH (the .pc file's run path must find the library);
    - ``go``: ``go run`` in a module of its own that requires
      ``memprobe.dev/memprobe`` with a ``replace`` to bindings/go;
    - ``rust``: compiled by rustc against the workspace's memprobe-core.

    A block that is not a whole program (C without ``main``, Go without
    ``package``, Rust without ``fn main``, Python that uses a ``model`` it
    never made) needs a fixture, named on the line before its fence::

        <!-- docs-test: fixture: c/loop.c -->

    Fixtures live in docs/test-fixtures/, in the open. For C, C++, Go and
    Rust the fixture is the program around the block: its line
    ``docs-test: block`` (in a comment) is replaced by the block, and the
    block's ``#include`` / ``use`` lines go to its line ``docs-test:
    includes``. For Python the fixture runs first, in the block's namespace.
    For a shell block the fixture (a file or a folder) is copied into the
    scratch directory first. A marker ``<!-- docs-test: file: NAME -->``
    also writes the block into the scratch directory as NAME, for the shell
    blocks after it (README's ``app.c``).

compared
    A ``text`` block preceded by ``<!-- docs-test: output -->`` is the
    expected output (stdout and stderr together) of the runnable block just
    before it. Both are compared line by line after masking what changes
    from run to run: every number (timings, sizes, pids, counts; digits,
    decimals and thousands separators become ``#``), absolute paths
    (``<path>``) and runs of spaces (column widths follow the numbers).
    A sampler's "(N ticks missed: ...)" note is dropped (it depends on the
    machine's load). Lines that describe the host rather than memprobe's answer — the
    summary's ``container`` and ``GPUs`` rows, whose content depends on the
    machine's cgroup and drivers — are compared by their label alone, and so
    is the ``RAM by kind`` row (its units and how near the peak its mappings
    were read follow the kernel's accounting and the machine's load). Python
    warnings (``file:line: XWarning: ...`` and the source line printed after
    it) are left out: whether one shows depends on the host (memprobe.gpu's
    note without a GPU) and on the warning filters.

marked not runnable
    ``<!-- docs-test: skip: REASON -->`` on the line before a fence: the
    block cannot run here (it needs a GPU, it is ``make test`` itself, it
    takes minutes), and REASON says so. The reason is printed in the
    counts; a marker without a reason fails.

data
    ``text`` (a listing, a tree, a transcript), ``json``, ``yaml``,
    ``promql`` and ``cmake`` are data, not programs: counted as data;
    ``json`` and ``yaml`` blocks must parse (after ``...`` / ``…``
    placeholders, which stand for elided values, are filled).

A block with no language, or one in a language not listed here, fails:
every block says what it is (a listing is ``text``), so nothing is
silently skipped. Markers sit on the lines just before the fence (several
markers may be stacked).

Scratch directories: each page gets build/docs-test/<page>/, emptied at
the start, holding a symbolic link to every top-level entry of the
repository except Cargo.toml and Cargo.lock. A block's relative paths
(``include/``, ``target/release``, ``make lib``) thus reach the built tree
while what it writes stays in the scratch directory; cargo, run there,
walks up to the repository's own workspace and shares its target
directory. HOME is the scratch directory too (``make install
PREFIX=$HOME/.local`` installs there). The installed prefix
(build/test-prefix: ``make install PREFIX=...``) comes first on PATH and
PKG_CONFIG_PATH.

Usage: docs_test.py [--prefix DIR] [--site DIR] [--list] [FILE...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "docs" / "test-fixtures"
SCRATCH = ROOT / "build" / "docs-test"

RUN = {"sh", "bash", "shell", "python", "ipython", "c", "cpp", "c++", "go", "rust"}
DATA = {"text", "json", "yaml", "promql", "cmake"}
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(\w+)\s*(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)\s*(.*)$")
TIMEOUT_S = 300


@dataclass
class Block:
    path: Path
    line: int  # the opening fence's line, from 1
    lang: str
    text: str
    markers: Dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


class DocError(Exception):
    pass


def parse(path: Path) -> List[Block]:
    """The fenced blocks of a Markdown file, with the markers above each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: List[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        start = i
        body: List[str] = []
        i += 1
        while i < len(lines):
            close = re.match(r"^\s*" + re.escape(fence[0]) + "{%d,}\\s*$" % len(fence), lines[i])
            if close:
                break
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        else:
            raise DocError(f"{path.relative_to(ROOT)}:{start + 1}: fence never closed")
        markers: Dict[str, str] = {}
        j = start - 1
        while j >= 0 and MARKER.match(lines[j]):
            mm = MARKER.match(lines[j])
            assert mm is not None
            markers[mm.group(1)] = mm.group(2) or ""
            j -= 1
        blocks.append(Block(path, start + 1, lang, "\n".join(body) + "\n", markers))
        i += 1
    return blocks


# --- masking, for output blocks ------------------------------------------------

# The sampler's note when it fell behind on a loaded machine.
MISSED_TICKS = re.compile(r"\s*\(\d+ ticks? missed[^)]*\)")
# A Python warning as the warnings module prints it: "file:line: XWarning: ...".
PY_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")
HOST_LINES = re.compile(r"^\s*(container \(cgroup v\d\)|container|GPUs|RAM by kind)\b")


def mask(text: str) -> List[str]:
    out: List[str] = []
    lines = text.splitlines()
    i = -1
    while i + 1 < len(lines):
        i += 1
        line = lines[i]
        if PY_WARNING.match(line):
            # Python's warning line, and the source line it quotes after it.
            if i + 1 < len(lines) and lines[i + 1].startswith("  "):
                i += 1
            continue
        host = HOST_LINES.match(line)
        if host:
            out.append("<host:" + host.group(1).split()[0] + ">")
            continue
        line = MISSED_TICKS.sub("", line)
        line = re.sub(r"(?<![\w.])/[^\s:,;)\]'\"]+", "<path>", line)
        line = re.sub(r"\d+(?:[.,]\d+)*", "#", line)
        line = re.sub(r"\s+", " ", line).strip()
        out.append(line)
    while out and not out[-1]:
        out.pop()
    while out and not out[0]:
        out.pop(0)
    return out


# --- running ---------------------------------------------------------------------


@dataclass
class Env:
    prefix: Path
    site: Optional[Path]
    python: str
    base: Dict[str, str]


def make_env(prefix: Path, site: Optional[Path], python: str, home: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS", "CARGO_MAKEFLAGS"))}
    env.pop("LD_LIBRARY_PATH", None)
    env.pop("MEMPROBE_LIBRARY", None)
    # Go's caches stay where they were, not under the scratch HOME.
    for var in ("GOCACHE", "GOMODCACHE", "GOPATH"):
        if var not in env:
            try:
                env[var] = subprocess.run(["go", "env", var], capture_output=True, text=True, check=True).stdout.strip()
            except (OSError, subprocess.CalledProcessError):
                pass
    if "CARGO_HOME" not in env:
        env["CARGO_HOME"] = str(Path.home() / ".cargo")
    if "RUSTUP_HOME" not in env:
        env["RUSTUP_HOME"] = str(Path.home() / ".rustup")
    env["HOME"] = str(home)
    env["PATH"] = os.pathsep.join([str(prefix / "bin"), str(Path(python).parent), env.get("PATH", "")])
    env["PKG_CONFIG_PATH"] = str(prefix / "lib" / "pkgconfig")
    if site is not None:
        env["PYTHONPATH"] = str(site)
        env["MEMPROBE_PYTHON_SITE"] = str(site)
    else:
        env["PYTHONPATH"] = str(ROOT / "bindings" / "python")
        env["MEMPROBE_LIBRARY"] = str(prefix / "lib" / "libmemprobe.so")
    env["GOTOOLCHAIN"] = "local"
    env["GOFLAGS"] = "-mod=mod"
    env["GOPROXY"] = "off"
    env["CGO_ENABLED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["NO_COLOR"] = "1"
    return env


def scratch_dir(page: Path) -> Path:
    """build/docs-test/<page>: docs/cli.md's is docs_cli."""
    return SCRATCH / page.relative_to(ROOT).as_posix().replace("/", "_").removesuffix(".md")


def fresh_scratch(page: Path) -> Path:
    d = scratch_dir(page)
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name in ("Cargo.toml", "Cargo.lock", ".git"):
            continue
        (d / entry.name).symlink_to(entry)
    return d


def run(cmd: List[str], cwd: Path, env: Dict[str, str], stdin: Optional[str] = None) -> Tuple[int, str]:
    try:
        p = subprocess.run(
            cmd, cwd=cwd, env=env, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode("utf-8", "replace")
        return 124, out + f"\n[docs-test: timed out after {TIMEOUT_S} s]\n"
    return p.returncode, p.stdout


def fixture(block: Block) -> Optional[Path]:
    name = block.markers.get("fixture")
    if name is None:
        return None
    p = FIXTURES / name
    if not p.exists():
        raise DocError(f"{block.where}: fixture {name} not found in {FIXTURES.relative_to(ROOT)}")
    return p


def wrap(block: Block, include_prefixes: Tuple[str, ...]) -> str:
    """The block inside its fixture (C, C++, Go, Rust)."""
    fx = fixture(block)
    if fx is None:
        return block.text
    template = fx.read_text()
    if "docs-test: block" not in template:
        raise DocError(f"{fx.relative_to(ROOT)} has no 'docs-test: block' line")
    heads = [l for l in block.text.splitlines() if l.startswith(include_prefixes)]
    body = [l for l in block.text.splitlines() if not l.startswith(include_prefixes)]
    out: List[str] = []
    for l in template.splitlines():
        if "docs-test: includes" in l:
            out.extend(heads)
        elif "docs-test: block" in l:
            out.append(f"#line {block.line + 1} \"{block.where.split(':')[0]}\"" if include_prefixes[0] == "#" else "")
            out.extend(body)
        else:
            out.append(l)
    if "docs-test: includes" not in template:
        out = heads + out
    return "\n".join(out) + "\n"


class Runner:
    def __init__(self, env: Dict[str, str], python: str, scratch: Path):
        self.env = env
        self.python = python
        self.scratch = scratch
        self.rust_externs: Optional[List[str]] = None

    def shell(self, b: Block) -> Tuple[int, str]:
        fx = fixture(b)
        if fx is not None:
            if fx.is_dir():
                shutil.copytree(fx, self.scratch, dirs_exist_ok=True)
            else:
                shutil.copy(fx, self.scratch / fx.name)
        return run(["bash", "-e", "-o", "pipefail", "-c", b.text], self.scratch, self.env)

    def python_block(self, b: Block, ipython: bool = False) -> Tuple[int, str]:
        fx = fixture(b)
        script = self.scratch / f".block-{b.line}.py"
        driver = [
            "import sys",
            "ns = {'__name__': '__main__'}",
        ]
        if fx is not None:
            driver.append(f"ns['__file__'] = {str(fx)!r}")
            driver.append(f"exec(compile(open({str(fx)!r}).read(), {str(fx.relative_to(ROOT))!r}, 'exec'), ns)")
            driver.append("del ns['__file__']")
        src_file = self.scratch / f".block-{b.line}.src.py"
        # Blank lines first, so that a traceback's line is the page's.
        src_file.write_text("\n" * b.line + b.text)
        if ipython:
            driver += [
                "from IPython.core.interactiveshell import InteractiveShell",
                "sh = InteractiveShell.instance(user_ns=ns)",
                f"r = sh.run_cell({json.dumps(b.text)})",
                "sys.exit(0 if r.success else 1)",
            ]
        else:
            driver.append(f"exec(compile(open({str(src_file)!r}).read(), {b.where.split(':')[0]!r}, 'exec'), ns)")
        script.write_text("\n".join(driver) + "\n")
        return run([self.python, str(script)], self.scratch, self.env)

    def pkg(self, *args: str) -> List[str]:
        p = subprocess.run(["pkg-config", *args, "memprobe"], env=self.env, capture_output=True, text=True)
        if p.returncode != 0:
            raise DocError(f"pkg-config {' '.join(args)} memprobe: {p.stderr.strip()}")
        return p.stdout.split()

    def c_block(self, b: Block) -> Tuple[int, str]:
        cpp = b.lang in ("cpp", "c++")
        if fixture(b) is None and not re.search(r"\bint\s+main\s*\(", b.text):
            raise DocError(f"{b.where}: a {b.lang} block without main() needs a fixture (<!-- docs-test: fixture: NAME -->)")
        src = self.scratch / f".block-{b.line}.{'cpp' if cpp else 'c'}"
        src.write_text(wrap(b, ("#",)))
        exe = self.scratch / f".block-{b.line}"
        cc = ["c++", "-std=c++17"] if cpp else ["cc"]
        rc, out = run(
            [*cc, "-Wall", "-Wextra", "-Werror", str(src), "-o", str(exe), *self.pkg("--cflags", "--libs")],
            self.scratch, self.env,
        )
        if rc != 0:
            return rc, f"[docs-test: compiling {src.name} failed]\n{out}"
        return run([str(exe)], self.scratch, self.env)

    def go_block(self, b: Block) -> Tuple[int, str]:
        if fixture(b) is None and not re.search(r"^package ", b.text, re.M):
            raise DocError(f"{b.where}: a go block without `package` needs a fixture")
        d = self.scratch / f".go-{b.line}"
        d.mkdir()
        (d / "go.mod").write_text(
            "module docs.example/block\n\ngo 1.21\n\nrequire memprobe.dev/memprobe v0.0.0\n\n"
            f"replace memprobe.dev/memprobe => {ROOT / 'bindings' / 'go'}\n"
        )
        (d / "main.go").write_text(wrap(b, ("import ",)))
        return run(["go", "run", "."], d, self.env)

    def rust_block(self, b: Block) -> Tuple[int, str]:
        if fixture(b) is None and "fn main" not in b.text:
            raise DocError(f"{b.where}: a rust block without fn main needs a fixture")
        if self.rust_externs is None:
            self.rust_externs = rust_externs(self.env)
        src = self.scratch / f".block-{b.line}.rs"
        src.write_text(wrap(b, ("use ",)))
        exe = self.scratch / f".block-{b.line}-rs"
        rc, out = run(
            ["rustc", "--edition", "2021", "--crate-name", "docs_block", "-D", "warnings", str(src), "-o", str(exe),
             *self.rust_externs],
            self.scratch, self.env,
        )
        if rc != 0:
            return rc, f"[docs-test: compiling {src.name} failed]\n{out}"
        return run([str(exe)], self.scratch, self.env)

    def block(self, b: Block) -> Tuple[int, str]:
        if b.lang in ("sh", "bash", "shell"):
            return self.shell(b)
        if b.lang == "python":
            return self.python_block(b)
        if b.lang == "ipython":
            return self.python_block(b, ipython=True)
        if b.lang in ("c", "cpp", "c++"):
            return self.c_block(b)
        if b.lang == "go":
            return self.go_block(b)
        if b.lang == "rust":
            return self.rust_block(b)
        raise AssertionError(b.lang)


def rust_externs(env: Dict[str, str]) -> List[str]:
    """memprobe-core as the workspace builds it (debug), for rustc --extern."""
    p = subprocess.run(
        ["cargo", "build", "-j2", "-p", "memprobe-core", "--lib", "--message-format=json-render-diagnostics"],
        cwd=ROOT, env={**env, "HOME": os.environ.get("HOME", "/")}, capture_output=True, text=True,
    )
    if p.returncode != 0:
        raise DocError(f"cargo build -p memprobe-core failed:\n{p.stderr[-3000:]}")
    rlib = None
    deps = set()
    for line in p.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact":
            continue
        for f in msg.get("filenames", []):
            deps.add(str(Path(f).parent))
            if msg["target"]["name"] == "memprobe_core" and f.endswith(".rlib"):
                rlib = f
    if rlib is None:
        raise DocError("cargo build -p memprobe-core named no memprobe_core rlib")
    return ["--extern", f"memprobe_core={rlib}", *[f"-Ldependency={d}" for d in sorted(deps)]]


def check_data(b: Block) -> Optional[str]:
    text = b.text.replace("…", "0").replace("...", "0")
    if b.lang == "json":
        try:
            json.loads(b.text)
        except json.JSONDecodeError as e:
            return f"does not parse as JSON: {e}"
    if b.lang == "yaml":
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            return "PyYAML is needed to check yaml blocks"
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as e:
            return f"does not parse as YAML: {e}"
    return None


@dataclass
class Counts:
    run: int = 0
    compared: int = 0
    skipped: int = 0
    data: int = 0
    failed: int = 0
    reasons: List[str] = field(default_factory=list)
    slow: List[Tuple[float, str]] = field(default_factory=list)


def tail(text: str, n: int = 40) -> str:
    lines = text.rstrip("\n").splitlines()
    cut = lines[-n:]
    return ("  ...\n" if len(lines) > n else "") + "\n".join("  | " + l for l in cut)


def test_page(page: Path, env_base: Dict[str, str], python: str, failures: List[str]) -> Counts:
    c = Counts()
    blocks = parse(page)
    scratch = fresh_scratch(page)
    env = dict(env_base, HOME=str(scratch))
    runner = Runner(env, python, scratch)
    last: Optional[Tuple[Block, str]] = None  # the last block run, and its output
    for b in blocks:
        try:
            unknown = set(b.markers) - {"skip", "output", "fixture", "file"}
            if unknown:
                raise DocError(f"{b.where}: unknown docs-test marker(s) {sorted(unknown)}")
            if "skip" in b.markers:
                if not b.markers["skip"]:
                    raise DocError(f"{b.where}: a skip marker needs a reason (<!-- docs-test: skip: REASON -->)")
                c.skipped += 1
                c.reasons.append(f"{b.line}: {b.markers['skip']}")
                last = None
                continue
            if "output" in b.markers:
                if b.lang != "text":
                    raise DocError(f"{b.where}: an output block is `text`, not `{b.lang or 'no language'}`")
                if last is None:
                    raise DocError(f"{b.where}: output block with no block run just before it")
                want, got = mask(b.text), mask(last[1])
                if want != got:
                    import difflib

                    diff = "\n".join(difflib.unified_diff(want, got, "the doc (masked)", "the run (masked)", lineterm=""))
                    raise DocError(f"{b.where}: output differs from {last[0].where}'s run\n{diff}\n  the run's output:\n{tail(last[1], 60)}")
                c.compared += 1
                last = None
                continue
            if not b.lang:
                raise DocError(f"{b.where}: a block with no language; say what it is (`text` for a listing)")
            if "file" in b.markers:
                (scratch / b.markers["file"]).write_text(b.text)
            if b.lang in DATA:
                err = check_data(b)
                if err:
                    raise DocError(f"{b.where}: {b.lang} block {err}")
                c.data += 1
                last = None
                continue
            if b.lang not in RUN:
                raise DocError(f"{b.where}: language `{b.lang}` is neither run nor data; mark it (skip: REASON) or add it to the harness")
            t0 = time.monotonic()
            rc, out = runner.block(b)
            dt = time.monotonic() - t0
            if rc != 0:
                raise DocError(f"{b.where}: {b.lang} block failed (status {rc}, {dt:.1f} s)\n{tail(out)}")
            c.run += 1
            c.slow.append((dt, f"{b.line} ({b.lang})"))
            last = (b, out)
        except DocError as e:
            c.failed += 1
            failures.append(str(e))
            last = None
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", type=Path, default=ROOT / "build" / "test-prefix")
    ap.add_argument("--site", type=Path, default=None, help="the installed Python package (MEMPROBE_PYTHON_SITE)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--list", action="store_true", help="list the blocks and what each is, run nothing")
    ap.add_argument("files", nargs="*", type=Path)
    a = ap.parse_args()
    pages = [p.resolve() for p in a.files] or [
        ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))
    ]
    if a.list:
        for page in pages:
            for b in parse(page):
                kind = "skip" if "skip" in b.markers else "output" if "output" in b.markers else (
                    "data" if b.lang in DATA else "run" if b.lang in RUN else "?")
                print(f"{b.where}\t{b.lang or '-'}\t{kind}\t{b.markers}")
        return 0
    if not (a.prefix / "lib" / "pkgconfig" / "memprobe.pc").exists():
        print(f"docs-test: {a.prefix} is not an installed prefix; run make install PREFIX={a.prefix}", file=sys.stderr)
        return 2
    site = a.site if a.site and (a.site / "memprobe" / "__init__.py").exists() else None
    SCRATCH.mkdir(parents=True, exist_ok=True)
    env = make_env(a.prefix.resolve(), site, a.python, SCRATCH)
    failures: List[str] = []
    total = Counts()
    t0 = time.monotonic()
    for page in pages:
        tp = time.monotonic()
        c = test_page(page, env, a.python, failures)
        for k in ("run", "compared", "skipped", "data", "failed"):
            setattr(total, k, getattr(total, k) + getattr(c, k))
        print(
            f"docs-test: {page.relative_to(ROOT)}: {c.run} run, {c.compared} compared, "
            f"{c.skipped} marked not runnable, {c.data} data, {c.failed} failed ({time.monotonic() - tp:.1f} s)",
            flush=True,
        )
        for r in c.reasons:
            print(f"    not runnable {page.name}:{r}")
        slow = [f"{where} {dt:.1f} s" for dt, where in sorted(c.slow, reverse=True) if dt >= 5]
        if slow:
            print(f"    slowest: {', '.join(slow[:5])}")
    print(
        f"docs-test: {len(pages)} files: {total.run} run, {total.compared} compared, {total.skipped} marked not "
        f"runnable, {total.data} data, {total.failed} failed, in {time.monotonic() - t0:.1f} s"
    )
    for f in failures:
        print("\nFAIL " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
