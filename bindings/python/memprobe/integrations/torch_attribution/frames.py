"""The frames shown for a block: the user's first. torch records the Python
stack of every allocation, innermost first; most of it is torch's own
(``torch/nn/modules/module.py``'s ``_call_impl`` ...) and, under an
integration, memprobe's or the trainer's. A frame of torch or memprobe is
left out; the frames outside any installed package (the user's own files)
come first, then those of other packages (Lightning, Transformers), each
group innermost first."""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

#: Frames kept per block: enough for the call site and its callers, bounded
#: so that a table stays small.
MAX_FRAMES = 8

_PACKAGE_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _package_dir(name: str) -> Optional[str]:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(list(spec.submodule_search_locations)[0]) + os.sep


_SKIPPED: Optional[Tuple[str, ...]] = None


def _skipped() -> Tuple[str, ...]:
    """Directories whose frames are never shown: torch's and memprobe's."""
    global _SKIPPED
    if _SKIPPED is None:
        dirs = [d for d in (_package_dir("torch"), _package_dir("memprobe")) if d]
        _SKIPPED = tuple(dirs)
    return _SKIPPED


def _is_skipped(filename: str, skipped: Sequence[str]) -> bool:
    if not filename or filename == "??" or filename.startswith("<frozen"):
        return True  # C++, or Python's own frozen modules
    if filename.startswith("<"):
        return False  # a notebook cell (<ipython-input-3-...>) or exec'd code: the user's
    path = os.path.realpath(filename) if os.path.isabs(filename) else filename
    if any(path.startswith(d) for d in skipped):
        return True
    # torch's files as recorded on another machine (a snapshot read later).
    return (os.sep + "torch" + os.sep) in path and any(p in path for p in _PACKAGE_DIRS)


def user_frames(frames: Iterable[Dict[str, Any]], limit: int = MAX_FRAMES) -> List[Dict[str, Any]]:
    """``frames`` (torch's ``{"filename", "line", "name"}``) as the record
    shows them (``{"file", "line", "function"}``): user files first, then
    other packages', torch's and memprobe's left out; at most ``limit``."""
    skipped = _skipped()
    own: List[Dict[str, Any]] = []
    packages: List[Dict[str, Any]] = []
    for f in frames:
        filename = str(f.get("filename", "") or "")
        if _is_skipped(filename, skipped):
            continue
        out = {"file": filename, "line": int(f.get("line", 0) or 0), "function": str(f.get("name", "") or "")}
        (packages if any(p in filename for p in _PACKAGE_DIRS) else own).append(out)
    return (own + packages)[:limit]
