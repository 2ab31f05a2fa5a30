#!/usr/bin/env python3
"""Fails when files of one Rust crate import each other in a cycle.

A file's imports are the paths it names inside its crate (`crate::`,
`super::`, `self::`, in `use` items and in code), resolved to the file that
defines the item: through module declarations (`mod x;`, `#[path]`) and
through re-exports (`pub use`), so `crate::Tracker` is tracker.rs, not lib.rs.
A module's parent declares it and re-exports its items: an edge from a file
to a file of its own submodules is structure, not a use, and is not counted.
Every other edge is, test code included, but for an import under
`#[cfg(doc)]` (there for a doc link only); a test module inside a file
(`#[cfg(test)] mod tests { ... }`) is a node of its own, since nothing
imports it. A cycle means two files that cannot be read one after the
other.

  scripts/import-cycles.py              every crate of the workspace
  scripts/import-cycles.py DIR...       the crates whose Cargo.toml is in DIR
  scripts/import-cycles.py --self-test  the checker on crates made up for it

Exit status 1 and each cycle printed (file -> file -> ... -> first file,
with the line of each import) when there is one.
"""

import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_code(text):
    """The text with comments, string and char literals blanked, every
    offset kept (a #[path]'s value is read from the original there)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 300]) if c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if m:
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "'":
            m = re.match(r"'(\\u\{[0-9A-Fa-f]+\}|\\x[0-9A-Fa-f]{2}|\\.|[^\\'\n])'", text[i:i + 12])
            if m:
                out.append(" " * m.end())
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


class Module:
    def __init__(self, path, file, parent):
        self.path = path          # tuple of names from the crate root
        self.file = file          # the file that holds it (inline modules: their file's)
        self.parent = parent
        self.children = {}        # name -> Module
        self.imports = {}         # name -> (path segments, base module) from `use`
        self.test_only = False    # an inline `#[cfg(test)] mod`: a node of its own

    def node(self):
        """What the graph counts: the file, or a test module inside it."""
        m = self
        while m.parent is not None and m.parent.file == m.file and not m.test_only:
            m = m.parent
        return m

    def label(self):
        n = self.node()
        top = n
        while top.parent is not None and top.parent.file == top.file:
            top = top.parent
        rel = os.path.relpath(n.file, ROOT)
        return rel if n is top else rel + "::" + "::".join(n.path[len(top.path):])


def split_use_tree(tree):
    """`a::{b, c::{d as e}}` -> [(['a','b'], 'b'), (['a','c','d'], 'e')]."""
    tree = re.sub(r"\s+", "", tree)
    results = []

    def walk(prefix, s):
        depth, start, parts = 0, 0, []
        for k, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:k])
                start = k + 1
        parts.append(s[start:])
        for p in parts:
            if not p:
                continue
            brace = p.find("{")
            if brace >= 0:
                head = p[:brace].rstrip(":")
                segs = [x for x in head.split("::") if x]
                walk(prefix + segs, p[brace + 1:p.rindex("}")])
            else:
                alias = None
                if "as" in p and re.search(r"(?<=[A-Za-z0-9_])as(?=[A-Za-z_])", p):
                    p, alias = re.split(r"(?<=[A-Za-z0-9_])as(?=[A-Za-z_])", p, maxsplit=1)
                segs = prefix + [x for x in p.split("::") if x]
                if not segs:
                    continue
                name = alias or segs[-1]
                if segs[-1] == "self":
                    segs = segs[:-1]
                    name = alias or (segs[-1] if segs else None)
                results.append((segs, name))

    walk([], tree)
    return results


class Crate:
    def __init__(self, name, root_file):
        self.name = name
        self.files = {}           # file -> [Module] it holds (outermost first)
        self.code = {}            # file -> stripped text
        self.refs = []            # (file, line, module, segments)
        self.root = self.load(root_file, (), None, is_dir_owner=True)

    def load(self, file, path, parent, is_dir_owner):
        module = Module(path, file, parent)
        try:
            text = open(file, encoding="utf-8").read()
        except OSError:
            return module
        code = strip_code(text)
        self.code[file] = code
        self.files.setdefault(file, []).append(module)
        base = os.path.dirname(file)
        if not is_dir_owner:
            base = os.path.join(base, os.path.splitext(os.path.basename(file))[0])
        self.parse(file, code, module, base, os.path.dirname(file))
        return module

    def parse(self, file, code, top, child_dir, path_dir):
        # Inline modules: a stack of (module, brace depth at which it closes).
        stack = [(top, -1)]
        depth = 0
        line_starts = [0] + [m.end() for m in re.finditer("\n", code)]

        def line_of(pos):
            lo, hi = 0, len(line_starts) - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if line_starts[mid] <= pos:
                    lo = mid
                else:
                    hi = mid - 1
            return lo + 1

        token = re.compile(
            r"(?P<cfgtest>#\[cfg\(test\)\])"
            r"|(?P<cfgdoc>#\[cfg\(doc\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?use\s[^;]*;)"
            r"|(?P<attr>#\[path\s*=[^\]]*\])"
            r"|(?P<mod>\bmod\s+(?P<modname>" + IDENT + r")\s*(?P<modend>[;{]))"
            r"|(?P<use>\buse\s+(?P<usetree>[^;]*);)"
            r"|(?P<ref>(?<![\w$:])(?P<refpath>(?:crate|super|self)(?:::(?:" + IDENT + r"|\{))+))"
            r"|(?P<open>\{)|(?P<close>\})"
        )
        # #[path] values are blanked as strings: read them from the original.
        original = open(file, encoding="utf-8").read()
        pending_path = None
        pending_test = False
        pos = 0
        while True:
            m = token.search(code, pos)
            if not m:
                break
            pos = m.end()
            cur = stack[-1][0]
            if m.group("open"):
                depth += 1
            elif m.group("close"):
                depth -= 1
                if len(stack) > 1 and depth == stack[-1][1]:
                    stack.pop()
            elif m.group("cfgdoc"):
                pass  # an import for doc links only: no use in code
            elif m.group("cfgtest"):
                pending_test = True
            elif m.group("attr"):
                om = re.match(r"#\[path\s*=\s*\"([^\"]*)\"", original[m.start():])
                pending_path = om.group(1) if om else None
            elif m.group("mod"):
                name = m.group("modname")
                if m.group("modend") == "{":
                    inner = Module(cur.path + (name,), file, cur)
                    inner.test_only = pending_test
                    cur.children[name] = inner
                    self.files[file].append(inner)
                    stack.append((inner, depth))
                    depth += 1
                    pending_path = None
                    pending_test = False
                    continue
                if pending_path is not None:
                    target = os.path.normpath(os.path.join(path_dir, pending_path))
                    owner = os.path.basename(target) == "mod.rs"
                else:
                    d = child_dir
                    for inline in stack[1:]:
                        d = os.path.join(d, inline[0].path[-1])
                    target = os.path.join(d, name + ".rs")
                    owner = False
                    if not os.path.exists(target):
                        target = os.path.join(d, name, "mod.rs")
                        owner = True
                pending_path = None
                pending_test = False
                cur.children[name] = self.load(target, cur.path + (name,), cur, owner)
            elif m.group("use"):
                pending_path = None
                pending_test = False
                tree = m.group("usetree")
                for segs, name in split_use_tree(tree):
                    if name and name != "*":
                        cur.imports[name] = segs
                    if segs and segs[0] in ("crate", "super", "self") or (segs and segs[0] in cur.children):
                        self.refs.append((file, line_of(m.start()), cur, segs))
            elif m.group("ref"):
                segs = [s for s in m.group("refpath").split("::") if s and s != "{"]
                self.refs.append((file, line_of(m.start()), cur, segs))

    def resolve(self, module, segs, seen=0):
        """The module that defines what `segs` names, seen from `module`."""
        if seen > 16 or not segs:
            return module
        cur = module
        i = 0
        if segs[0] == "crate":
            cur, i = self.root, 1
        elif segs[0] == "self":
            i = 1
        elif segs[0] == "super":
            while i < len(segs) and segs[i] == "super":
                cur = cur.parent or cur
                i += 1
        elif segs[0] not in cur.children:
            return None  # another crate's path, or a local name
        while i < len(segs):
            s = segs[i]
            if s in cur.children:
                cur = cur.children[s]
                i += 1
                continue
            if s in cur.imports:
                target = cur.imports[s]
                if target and target[0] in ("crate", "super", "self") or (target and target[0] in cur.children):
                    via = self.resolve(cur, target + segs[i + 1:], seen + 1)
                    return via if via is not None else cur
            break
        return cur

    def edges(self):
        """node -> {node: first line of the import}, nodes by label."""
        out = {}
        for file, line, module, segs in self.refs:
            target = self.resolve(module, segs)
            if target is None:
                continue
            src, dst = module.node(), target.node()
            if src is dst:
                continue
            # The parent declaring and re-exporting its submodules.
            if any(m is src for m in ancestors(dst)):
                continue
            out.setdefault(src.label(), {}).setdefault(dst.label(), line)
        return out


def ancestors(module):
    m = module.parent
    while m is not None:
        yield m
        m = m.parent


def cycles(edges):
    """Each strongly connected component of more than one file, with one
    cycle through it."""
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    found = []
    for comp in comps:
        members = set(comp)
        start = comp[0]
        # Shortest cycle back to start, inside the component.
        prev, frontier, done = {start: None}, [start], None
        while frontier and done is None:
            nxt = []
            for v in frontier:
                for w in sorted(edges.get(v, {})):
                    if w not in members:
                        continue
                    if w == start:
                        done = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if done is not None:
                    break
            frontier = nxt
        path = [done]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        path.reverse()
        found.append(path + [start])
    return found


def crate_roots(dirs):
    for d in dirs:
        for owner, subdirs, files in os.walk(d):
            subdirs[:] = [s for s in subdirs if s not in ("target", "build", ".git", "node_modules")]
            if "Cargo.toml" not in files:
                continue
            for root in ("src/lib.rs", "src/main.rs"):
                f = os.path.join(owner, root)
                if os.path.exists(f):
                    yield os.path.relpath(owner, ROOT), f


def check(dirs, out=sys.stdout):
    bad = 0
    for name, root in crate_roots(dirs):
        crate = Crate(name, root)
        edges = crate.edges()
        for cyc in cycles(edges):
            bad += 1
            hops = []
            for a, b in zip(cyc, cyc[1:]):
                hops.append("%s (line %d)" % (a, edges[a][b]))
            out.write("import cycle in %s: %s -> %s\n" % (name, " -> ".join(hops), cyc[-1]))
    return bad


def self_test():
    def crate(files):
        d = tempfile.mkdtemp(prefix="import-cycles-")
        open(os.path.join(d, "Cargo.toml"), "w").close()
        for path, text in files.items():
            p = os.path.join(d, "src", path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
        return d

    class Sink:
        def __init__(self):
            self.text = ""

        def write(self, s):
            self.text += s

    cases = [
        # A cycle through a re-export at the root, a `use` group and a path in code.
        ("cycle", 1, {
            "lib.rs": "mod a;\nmod b;\nmod c;\npub use a::A;\n",
            "a.rs": "use crate::{b::B, c};\npub struct A;\n",
            "b.rs": "pub struct B;\nfn f() { let _ = super::c::g(); }\n",
            "c.rs": "pub fn g() -> crate::A { crate::A }\n",
        }),
        # One direction only; a parent using its child; comments and strings.
        ("acyclic", 0, {
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "mod inner;\nuse inner::X;\n// crate::b::cycle\nconst S: &str = \"crate::b\";\n",
            "a/inner.rs": "pub struct X;\nuse super::super::b::B;\n",
            "b.rs": "pub struct B;\n#[cfg(test)]\nmod tests {\n    use super::B;\n    fn f() -> char { '{' }\n}\n",
        }),
        # A module at a #[path], re-exported by its parent.
        ("path", 1, {
            "lib.rs": "mod p;\nmod q;\n",
            "p.rs": "#[path = \"p_impl.rs\"]\nmod imp;\npub use imp::f;\n",
            "p_impl.rs": "pub fn f() {}\nfn h() { crate::q::g() }\n",
            "q.rs": "pub fn g() { crate::p::f() }\n",
        }),
        # A doc link's import is no use.
        ("doc", 0, {
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "#[cfg(doc)]\nuse crate::b::B;\npub struct A;\n",
            "b.rs": "pub struct B(crate::a::A);\n",
        }),
        # A file's tests may use what uses the file: nothing imports tests.
        ("tests", 0, {
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "pub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}\n",
            "b.rs": "pub struct B(crate::a::A);\n",
        }),
    ]
    failed = 0
    for name, want, files in cases:
        sink = Sink()
        got = check([crate(files)], sink)
        if got != want:
            failed += 1
            sys.stderr.write("self-test %s: %d cycles, expected %d\n%s" % (name, got, want, sink.text))
    return failed


def main(argv):
    if argv[1:] == ["--self-test"]:
        failed = self_test()
        if failed == 0:
            print("import-cycles: self-test passed")
        return 1 if failed else 0
    dirs = argv[1:] or [ROOT]
    bad = check([os.path.abspath(d) for d in dirs])
    if bad:
        sys.stderr.write("import-cycles: %d cycle(s) between files of one crate; make the pieces depend in one direction\n" % bad)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
