"""How attribution is asked for: ``attribution=True`` or an
:class:`AttributionOptions`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class AttributionOptions:
    """``top``: blocks named per table (the others make one ``rest`` line).
    ``max_entries``: torch's history ring buffer (entries kept, per device);
    a step with more allocations and frees than this loses its start and is
    reported incomplete. ``cpp_stacks``: C++ frames too (torch's
    ``stacks="all"``: far slower). ``directory``: where the records go
    (``MEMPROBE_ATTRIBUTION_DIR``, set by ``memprobe run``, wins; default
    ``./memprobe-attribution``). ``modules``: name the forward module of
    frameless backward blocks (a forward hook on every module)."""

    top: int = 10
    max_entries: int = 100_000
    cpp_stacks: bool = False
    directory: Optional[str] = None
    modules: bool = True

    def __post_init__(self) -> None:
        if self.top < 1:
            raise ValueError(f"attribution top must be >= 1, not {self.top}")
        if self.max_entries < 1:
            raise ValueError(f"attribution max_entries must be >= 1, not {self.max_entries}")


def as_options(value: Any) -> Optional[AttributionOptions]:
    """None or False: off; True: the defaults; an :class:`AttributionOptions`
    as is; a dict: its keyword arguments."""
    if value is None or value is False:
        return None
    if value is True:
        return AttributionOptions()
    if isinstance(value, AttributionOptions):
        return value
    if isinstance(value, dict):
        return AttributionOptions(**value)
    raise TypeError(f"attribution= takes True, an AttributionOptions or a dict, not {type(value).__name__}")
