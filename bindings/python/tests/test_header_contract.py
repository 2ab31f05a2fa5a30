"""The binding's hand-written copies of the C ABI against include/memprobe.h.

memprobe/_ffi.py, errors.py and the enums of sources.py, tracker.py and
gpu.py repeat the header's constants and struct layouts for ctypes. This
test reads the names from the header, compiles a small C program that
prints what the C compiler makes of them (every #define and enum value,
every struct's size and every field's offset and size), and fails on any
difference: a constant missing or different in Python, a struct field
missing, renamed, reordered, resized or moved.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from conftest import ROOT, require

from memprobe import _ffi, _version
from memprobe.errors import Status
from memprobe.gpu import Backend
from memprobe.marks import MarkValue
from memprobe.sources import Fidelity, SourceKind
from memprobe.tracker import PhaseKind

HEADER = ROOT / "include" / "memprobe.h"

# C enum prefix -> the Python enum holding its values (member = the rest).
ENUMS = {
    "MEMPROBE_STATUS_": Status,
    "MEMPROBE_SOURCE_KIND_": SourceKind,
    "MEMPROBE_FIDELITY_": Fidelity,
    "MEMPROBE_PHASE_KIND_": PhaseKind,
    "MEMPROBE_GPU_BACKEND_": Backend,
    "MEMPROBE_MARK_VALUE_": MarkValue,
}
# #defines that are not constants of the ABI's calls.
# (Include guards; a define is a constant only with a value on its own line.)
NOT_CONSTANTS = {"MEMPROBE_H", "MEMPROBE_H_DEPRECATED"}
VERSION_MACROS = {"MEMPROBE_VERSION_MAJOR", "MEMPROBE_VERSION_MINOR", "MEMPROBE_VERSION_PATCH"}


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_defines(text: str) -> List[str]:
    return [
        n
        for n in re.findall(r"^#define[ \t]+(MEMPROBE_[A-Z0-9_]+)[ \t]+\S", text, re.M)
        if n not in NOT_CONSTANTS
    ]


def header_enum_constants(text: str) -> List[str]:
    names: List[str] = []
    for body in re.findall(r"\benum\s+memprobe_\w+[^{;]*\{(.*?)\}", text, re.S):
        names += re.findall(r"\b(MEMPROBE_[A-Z0-9_]+)\s*=", body)
    return names


def header_structs(text: str) -> Dict[str, List[str]]:
    """``typedef struct { fields } name;`` -> field names in order."""
    structs = {}
    for body, name in re.findall(r"typedef\s+struct\s*\{(.*?)\}\s*(memprobe_\w+)\s*;", text, re.S):
        fields = re.findall(r"\b(\w+)\s*(?:\[\s*\w+\s*\])?\s*;", body)
        structs[name] = fields
    return structs


def c_facts(tmp_path: Path, constants: List[str], structs: Dict[str, List[str]]) -> Dict[str, int]:
    """Compiles and runs a C program printing ``key value`` lines."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    require(cc is not None, "no C compiler (cc) to read the header's layout")
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "memprobe.h"', "int main(void) {"]
    for name in constants:
        lines.append(f'  printf("{name} %lld\\n", (long long)({name}));')
    for struct, fields in structs.items():
        lines.append(f'  printf("sizeof {struct} %zu\\n", sizeof({struct}));')
        for f in fields:
            lines.append(f'  printf("offsetof {struct}.{f} %zu\\n", offsetof({struct}, {f}));')
            lines.append(f'  printf("sizeof {struct}.{f} %zu\\n", sizeof((({struct} *)0)->{f}));')
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    build = subprocess.run(
        [cc, "-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{HEADER.parent}", str(src), "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    facts = {}
    for line in out.splitlines():
        key, value = line.rsplit(" ", 1)
        facts[key] = int(value)
    return facts


@pytest.fixture(scope="module")
def header():
    text = strip_comments(HEADER.read_text())
    return header_defines(text), header_enum_constants(text), header_structs(text)


@pytest.fixture(scope="module")
def facts(header, tmp_path_factory):
    defines, enums, structs = header
    return c_facts(tmp_path_factory.mktemp("layout"), defines + enums, structs)


def test_the_header_is_parsed(header):
    defines, enums, structs = header
    # Guards against a parser that silently finds nothing to compare.
    assert "MEMPROBE_SAMPLE_TOTAL" in defines and "MEMPROBE_STATUS_INTERNAL" in enums
    assert {"memprobe_sample", "memprobe_delta", "memprobe_phase_record"} <= set(structs)
    assert structs["memprobe_source_info"] == ["kind", "fidelity", "name"]


def test_every_define_matches(header, facts):
    defines, _, _ = header
    wrong = []
    for name in defines:
        if name in VERSION_MACROS:
            continue
        if not hasattr(_ffi, name):
            wrong.append(f"{name}: missing from memprobe/_ffi.py (C: {facts[name]})")
        elif getattr(_ffi, name) != facts[name]:
            wrong.append(f"{name}: Python {getattr(_ffi, name)}, C {facts[name]}")
    assert not wrong, "\n".join(wrong)
    major, minor, patch = (facts[f"MEMPROBE_VERSION_{p}"] for p in ("MAJOR", "MINOR", "PATCH"))
    assert _version.ABI == (major, minor)
    assert _version.__version__ == f"{major}.{minor}.{patch}"


def test_every_enum_constant_matches(header, facts):
    _, enums, _ = header
    wrong = []
    seen: Dict[type, set] = {cls: set() for cls in ENUMS.values()}
    for name in enums:
        prefix = next((p for p in ENUMS if name.startswith(p)), None)
        if prefix is None:
            wrong.append(f"{name}: an enum the binding does not know (add it to ENUMS and to Python)")
            continue
        cls = ENUMS[prefix]
        member = name[len(prefix):]
        seen[cls].add(member)
        if member not in cls.__members__:
            wrong.append(f"{name}: missing from {cls.__module__}.{cls.__name__} (C: {facts[name]})")
        elif cls[member] != facts[name]:
            wrong.append(f"{name}: Python {int(cls[member])}, C {facts[name]}")
    for cls, members in seen.items():
        extra = set(cls.__members__) - members
        if extra:
            wrong.append(f"{cls.__name__}: {sorted(extra)} are not in the header")
    assert not wrong, "\n".join(wrong)


def ctypes_structs() -> Dict[str, type]:
    return {
        name: obj
        for name, obj in vars(_ffi).items()
        if isinstance(obj, type) and issubclass(obj, ctypes.Structure) and name.startswith("memprobe_")
    }


def test_every_struct_layout_matches(header, facts):
    _, _, structs = header
    ours = ctypes_structs()
    wrong = []
    bound = set(ours) & set(structs)
    # Every struct the binding declares is in the header; the header's are all bound.
    wrong += [f"{n}: declared in _ffi.py, not in the header" for n in sorted(set(ours) - set(structs))]
    wrong += [f"{n}: in the header, not declared in _ffi.py" for n in sorted(set(structs) - set(ours))]
    for name in sorted(bound):
        cls = ours[name]
        fields: List[Tuple[str, ...]] = list(cls._fields_)
        py_names = [f[0] for f in fields]
        if py_names != structs[name]:
            wrong.append(f"{name}: fields {py_names} in Python, {structs[name]} in C")
            continue
        if ctypes.sizeof(cls) != facts[f"sizeof {name}"]:
            wrong.append(f"{name}: size {ctypes.sizeof(cls)} in Python, {facts[f'sizeof {name}']} in C")
        for f in py_names:
            desc = getattr(cls, f)
            c_off, c_size = facts[f"offsetof {name}.{f}"], facts[f"sizeof {name}.{f}"]
            if (desc.offset, desc.size) != (c_off, c_size):
                wrong.append(
                    f"{name}.{f}: offset {desc.offset} size {desc.size} in Python, "
                    f"offset {c_off} size {c_size} in C"
                )
    assert not wrong, "\n".join(wrong)


def test_a_wrong_layout_is_caught(header, facts):
    """The comparison itself can fail: a struct with two fields swapped."""
    _, _, structs = header

    class swapped(ctypes.Structure):
        _fields_ = [("fidelity", ctypes.c_uint32), ("kind", ctypes.c_uint32), ("name", ctypes.c_char * 72)]

    assert [f[0] for f in swapped._fields_] != structs["memprobe_source_info"]

    class short(ctypes.Structure):
        _fields_ = [("kind", ctypes.c_uint32), ("fidelity", ctypes.c_uint32), ("name", ctypes.c_char * 64)]

    assert ctypes.sizeof(short) != facts["sizeof memprobe_source_info"]
