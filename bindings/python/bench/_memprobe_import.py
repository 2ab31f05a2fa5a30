"""Which memprobe the benchmarks measure.

The installed package first (``pip install ./bindings/python`` builds the
library into it): a source tree put first on ``sys.path`` would shadow it
with a package whose ``_lib/`` is empty. Without an installed package (or
with one that cannot load its library), this checkout's source tree, with
the library named by ``MEMPROBE_LIBRARY`` or else built in ``target/``
(release, then debug). To measure the source tree although a package is
installed: ``PYTHONPATH=bindings/python MEMPROBE_LIBRARY=...``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
ROOT = TREE.parent.parent


def _forget_memprobe() -> None:
    for name in [m for m in sys.modules if m == "memprobe" or m.startswith("memprobe.")]:
        del sys.modules[name]


def import_memprobe() -> ModuleType:
    """The memprobe package to measure (see the module's documentation);
    exits with what to do when there is none."""
    try:
        import memprobe

        return memprobe
    except ImportError as e:
        installed = e
    _forget_memprobe()
    if not os.environ.get("MEMPROBE_LIBRARY"):
        for profile in ("release", "debug"):
            lib = ROOT / "target" / profile / "libmemprobe.so"
            if lib.exists():
                os.environ["MEMPROBE_LIBRARY"] = str(lib)
                break
    sys.path.insert(0, str(TREE))
    try:
        import memprobe

        return memprobe
    except ImportError as e:
        sys.exit(
            "memprobe is neither installed nor usable from this checkout.\n"
            f"  installed package: {installed}\n"
            f"  source tree {TREE}: {e}\n"
            "Install it (pip install ./bindings/python), or build the library "
            "(cargo build --release -p memprobe-ffi) or set MEMPROBE_LIBRARY."
        )


def describe(memprobe: ModuleType) -> str:
    """``memprobe <version> (<package dir>, <library>)`` for a benchmark's header."""
    return f"memprobe {memprobe.library_version()} ({Path(memprobe.__file__).parent}, {memprobe.library_path()})"
