"""The subset of JSON Schema (draft 2020-12) memprobe's schema files use —
type, const, enum, properties, required, dependentRequired,
additionalProperties, items, prefixItems, minItems, maxItems, anyOf, $ref
into $defs, minimum — the same subset as the Rust checker
(memprobe-cli/tests/cli/schema.rs). A keyword outside it is an error, so a
schema cannot silently use something this checker ignores. Standalone (no
pytest, no memprobe): scripts/gpu-validate-oom.py uses it too.

Why two checkers rather than one: this one runs where there is no Rust
toolchain (the GPU validation script on a GPU host, the tests of an
installed wheel), the Rust one where there may be no Python (`cargo test`,
the CLI's unit tests); calling one from the other would make each suite
depend on the other's toolchain. Both refuse keywords outside the subset,
so neither can pass a schema the other would check differently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[3]

ANNOTATIONS = {"$schema", "$id", "title", "description", "$defs"}
TYPES = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
}


def load(relative: str) -> Dict[str, Any]:
    return json.loads((ROOT / relative).read_text())


def check(schema: Any, doc: Any) -> List[str]:
    errors: List[str] = []
    _check(schema, schema, doc, "$", errors)
    return errors


def _check(root: Dict[str, Any], schema: Any, v: Any, path: str, errors: List[str]) -> None:
    if schema is True:
        return
    if schema is False:
        errors.append(f"{path}: not allowed")
        return
    for key, s in schema.items():
        if key in ANNOTATIONS:
            continue
        if key == "$ref":
            name = s.removeprefix("#/$defs/")
            _check(root, root["$defs"][name], v, path, errors)
        elif key == "type":
            types = s if isinstance(s, list) else [s]
            if not any(TYPES[t](v) for t in types):
                errors.append(f"{path}: {v!r} is not of type {s}")
        elif key == "const":
            if v != s or type(v) is not type(s):
                errors.append(f"{path}: {v!r} is not {s!r}")
        elif key == "enum":
            if v not in s:
                errors.append(f"{path}: {v!r} is not one of {s}")
        elif key == "minimum":
            if TYPES["number"](v) and v < s:
                errors.append(f"{path}: {v} is below {s}")
        elif key == "required":
            if isinstance(v, dict):
                errors.extend(f"{path}: missing required field {r}" for r in s if r not in v)
        elif key == "dependentRequired":
            if isinstance(v, dict):
                errors.extend(
                    f"{path}: {name} without {r}" for name, needs in s.items() if name in v for r in needs if r not in v
                )
        elif key == "properties":
            if isinstance(v, dict):
                for name, sub in s.items():
                    if name in v:
                        _check(root, sub, v[name], f"{path}.{name}", errors)
        elif key == "additionalProperties":
            if isinstance(v, dict):
                known = schema.get("properties", {})
                for name, x in v.items():
                    if name in known:
                        continue
                    if s is False:
                        errors.append(f"{path}: unexpected field {name}")
                    else:
                        _check(root, s, x, f"{path}.{name}", errors)
        elif key == "items":
            if isinstance(v, list):
                for i, x in enumerate(v):
                    _check(root, s, x, f"{path}[{i}]", errors)
        elif key == "prefixItems":
            if isinstance(v, list):
                for i, (x, sub) in enumerate(zip(v, s)):
                    _check(root, sub, x, f"{path}[{i}]", errors)
        elif key in ("minItems", "maxItems"):
            if isinstance(v, list) and (len(v) < s if key == "minItems" else len(v) > s):
                errors.append(f"{path}: {len(v)} items, {key} {s}")
        elif key == "anyOf":
            branches = []
            for b in s:
                e: List[str] = []
                _check(root, b, v, path, e)
                if not e:
                    break
                branches.extend(e)
            else:
                errors.append(f"{path}: matches no branch of anyOf: {'; '.join(branches)}")
        else:
            raise ValueError(f"schema keyword {key} at {path} is not supported by this checker")


def assert_valid(relative: str, doc: Any) -> None:
    errors = check(load(relative), doc)
    assert not errors, f"document does not match {relative}:\n  " + "\n  ".join(errors)
