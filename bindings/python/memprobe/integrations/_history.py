"""An integration's ``history`` of ended phases, ``(phase, index, [Delta,
...])``, whose per-step records are kept as the boundary read them and made
into :class:`Delta` objects when the history is read: building them is a
third of a training step's boundary when the step runs cold, and most
steps' records are never read during training.

A step's record is kept either as plain integers (:meth:`History.add_raw`)
or, cheaper still, as the bytes of the library's result array appended to
:attr:`History.steps` (one ``bytearray +=`` per step: no Python object is
made at all); :meth:`History.steps_begin` says how to read those bytes and
which step index they start at."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Tuple, Union

from ..windows import Delta, RawDeltas, deltas_of

Record = Tuple[str, int, List[Delta]]

#: How the step records of :attr:`History.steps` read: the phase's name,
#: the bytes of one record, and ``unpack_from(buffer, offset)`` of one.
Layout = Tuple[str, int, Callable[[Any, int], RawDeltas]]

#: What waits in the history until it is read, in order, each at the offset
#: of :attr:`History.steps` it follows: an ended phase (its Delta list or
#: its raw reading), or (phase None) the start of step records of a layout
#: and first index.
_Event = Tuple[int, Optional[str], int, Union[List[Delta], RawDeltas, Layout]]


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
    into ``Delta`` objects first.

    Threads: one thread (the training loop's) adds records and appends to
    :attr:`steps`, taking no lock (:meth:`trim` excepted); readers of any
    thread take turns. A reader never changes :attr:`steps`: it remembers
    how far it read, and the adding thread drops what was read
    (:meth:`trim`), so that the offsets it keeps stay true."""

    __slots__ = ("_records", "_pending", "_reading", "steps", "_taken", "_next", "_layout")

    def __init__(self) -> None:
        self._records: List[Record] = _Live(self)
        # Records added since the history was last read, in order (see
        # _Event): nothing is built before the history is read (not at a
        # log, which adds an interval).
        self._pending: List[_Event] = []
        # Readers take turns; the training thread's appends take no lock.
        self._reading = threading.Lock()
        #: Step records as the library wrote them, appended by the adding
        #: thread (``history.steps += result``) after :meth:`steps_begin`.
        self.steps = bytearray()
        # The reader's place in steps, the index of the step record there
        # and how it reads (as of the last event read).
        self._taken = 0
        self._next = 0
        self._layout: Optional[Layout] = None

    def add(self, phase: str, index: int, deltas: List[Delta]) -> None:
        self._pending.append((len(self.steps), phase, index, deltas))

    def add_raw(self, phase: str, index: int, raw: RawDeltas) -> None:
        self._pending.append((len(self.steps), phase, index, raw))

    def steps_begin(self, phase: str, index: int, size: int, unpack: Callable[[Any, int], RawDeltas]) -> None:
        """The records appended to :attr:`steps` from now on are ``phase``
        ``index``, ``index + 1``, ...: ``size`` bytes each, read by
        ``unpack(buffer, offset)``. Call it before the first, and again
        whenever the next record appended is not the one after the last
        (records left out) or reads otherwise (other sources)."""
        self._pending.append((len(self.steps), None, index, (phase, size, unpack)))

    def records(self) -> List[Record]:
        self._flush()
        return self._records

    def _flush(self) -> None:
        if self._pending or len(self.steps) != self._taken:
            with self._reading:
                list.extend(self._records, self._read())

    def _read(self, build: bool = True) -> List[Record]:
        """Takes in what was added since the last read (under the lock):
        the records, in order, or (``build`` false) nothing but the place."""
        steps = self.steps
        # The end first, then the events: a step appended after this end
        # and before an event taken below is read as that event's offset
        # says (offsets only grow), and any event left for the next read
        # comes after this end.
        end = len(steps)
        pending = self._pending
        n = len(pending)
        out: List[Record] = []
        pos, index, layout = self._taken, self._next, self._layout
        for at, phase, i, payload in pending[:n]:
            if pos < at:
                index = self._steps_into(out if build else None, layout, pos, at, index)
                pos = at
            if phase is None:
                index, layout = i, payload  # type: ignore[assignment]
            elif build:
                out.append((phase, i, deltas_of(payload) if isinstance(payload, tuple) else payload))  # type: ignore[arg-type]
        if pos < end:
            index = self._steps_into(out if build else None, layout, pos, end, index)
            pos = end
        # (`del` of the first n: an event the adding thread appends
        # meanwhile stays for the next read.)
        del pending[:n]
        self._taken, self._next, self._layout = pos, index, layout
        return out

    def _steps_into(self, out: Optional[List[Record]], layout: Optional[Layout], start: int, end: int, index: int) -> int:
        """The step records of steps[start:end] into ``out``; the index after them."""
        if layout is None:
            raise RuntimeError("memprobe: step records kept without History.steps_begin")
        phase, size, unpack = layout
        steps = self.steps
        for at in range(start, end, size):
            if out is not None:
                out.append((phase, index, deltas_of(unpack(steps, at))))
            index += 1
        return index

    def trim(self) -> None:
        """Drops the step records already read from :attr:`steps` (the
        adding thread only: an offset it keeps into :attr:`steps` is then
        ``len(steps)`` or later)."""
        if self._taken:
            with self._reading:
                taken = self._taken
                del self.steps[:taken]
                self._pending[:] = [(at - taken, p, i, x) for at, p, i, x in self._pending]
                self._taken = 0

    def replace(self, records: Union[List[Record], "History"]) -> None:
        """``owner.history = [...]``: the list given becomes the history
        (what was added before and not read yet is dropped)."""
        with self._reading:
            self._read(build=False)
        self._records = records.records() if isinstance(records, History) else records
