"""Old public names kept, deprecated, for one minor version: each still
names the same object, and using it emits a DeprecationWarning that says the
new name and the release that removes the old one. A module's
``__getattr__`` (PEP 562) calls :func:`old_name`, so importing the package
warns about nothing and only code that uses an old name hears of it."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Mapping, Tuple

#: old name -> (new name, why it changed, the release that removes it)
RENAMED: Dict[str, Tuple[str, str, str]] = {
    # docs/architecture.md, "One name per OOM meaning".
    "OomReport": (
        "OomRetryResult",
        "the OOM retry's result, not an OOM report",
        "0.3.0",
    ),
}


def old_name(module: str, name: str, namespace: Mapping[str, Any]) -> Any:
    """The object an old name stands for in ``namespace``, with a
    DeprecationWarning; AttributeError for any other missing name."""
    if name in RENAMED:
        new, why, removed_in = RENAMED[name]
        if new in namespace:
            warnings.warn(
                f"{module}.{name} is deprecated: it is {module}.{new} "
                f"({why}); "
                f"{name} is removed in {removed_in}",
                DeprecationWarning,
                stacklevel=3,
            )
            return namespace[new]
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
