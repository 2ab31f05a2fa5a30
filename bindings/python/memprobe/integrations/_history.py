"""An integration's ``history`` of ended phases, ``(phase, index, [Delta,
...])``, whose per-step records are kept as the boundary read them
(:data:`memprobe.windows.RawDeltas`, plain integers) and made into
:class:`Delta` objects when the history is read: building them is a third
of a training step's boundary when the step runs cold, and most steps'
records are never read during training."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Tuple, Union

from ..windows import Delta, RawDeltas, deltas_of

Record = Tuple[str, int, List[Delta]]


class _Live(list):  # type: ignore[type-arg]
    """The history's list: every list method first takes in the records
    still pending, so a reference kept from before (``h = cb.history``)
    sees every phase that ended since, as a plain list would have. Copied
    or pickled, it is a plain list."""

    __slots__ = ("_owner",)

    def __init__(self, owner: "History") -> None:
        super().__init__()
        self._owner = owner

    def __reduce_ex__(self, protocol: Any) -> Any:
        self._owner._flush()
        return (list, (list.copy(self),))


def _flushing(name: str) -> Callable[..., Any]:
    base = getattr(list, name)

    def method(self: _Live, *args: Any, **kwargs: Any) -> Any:
        self._owner._flush()
        return base(self, *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = "_Live." + name
    method.__doc__ = base.__doc__
    return method


for _name in (
    "__len__", "__getitem__", "__setitem__", "__delitem__", "__iter__", "__reversed__",
    "__contains__", "__repr__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    "__add__", "__iadd__", "__mul__", "__rmul__", "__imul__", "__sizeof__",
    "append", "extend", "insert", "pop", "remove", "clear", "index", "count", "copy", "sort", "reverse",
):
    setattr(_Live, _name, _flushing(_name))


class History:
    """The records in the order their phases ended; :meth:`records` is the
    list itself (a user may clear or edit it), with every raw record made
    into ``Delta`` objects first."""

    __slots__ = ("_records", "_pending", "_reading")

    def __init__(self) -> None:
        self._records: List[Record] = _Live(self)
        # Records added since the history was last read, in order, each
        # with its Delta list or its raw reading (a tuple): nothing is built
        # before the history is read (not at a log, which adds an interval).
        self._pending: List[Tuple[str, int, Union[List[Delta], RawDeltas]]] = []
        # Readers take turns; the training thread's appends take no lock.
        self._reading = threading.Lock()

    def add(self, phase: str, index: int, deltas: List[Delta]) -> None:
        self._pending.append((phase, index, deltas))

    def add_raw(self, phase: str, index: int, raw: RawDeltas) -> None:
        self._pending.append((phase, index, raw))

    def records(self) -> List[Record]:
        self._flush()
        return self._records

    def _flush(self) -> None:
        pending = self._pending
        if pending:
            with self._reading:
                # The first n records, copied and then removed, each in one
                # step under the GIL: a step the training thread adds
                # meanwhile stays for the next read. (`list.extend`: the
                # live list's own would come back here.)
                n = len(pending)
                list.extend(
                    self._records,
                    ((p, i, deltas_of(d) if isinstance(d, tuple) else d) for p, i, d in pending[:n]),
                )
                del pending[:n]

    def replace(self, records: Union[List[Record], "History"]) -> None:
        """``owner.history = [...]``: the list given becomes the history."""
        with self._reading:
            del self._pending[:]
        self._records = records.records() if isinstance(records, History) else records
