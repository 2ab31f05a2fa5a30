"""An integration's ``history`` of ended phases, ``(phase, index, [Delta,
...])``, whose per-step records are kept as the boundary read them
(:data:`memprobe.windows.RawDeltas`, plain integers) and made into
:class:`Delta` objects when the history is read: building them is a third
of a training step's boundary when the step runs cold, and most steps'
records are never read during training."""

from __future__ import annotations

import threading
from typing import List, Tuple, Union

from ..windows import Delta, RawDeltas, deltas_of

Record = Tuple[str, int, List[Delta]]


class History:
    """The records in the order their phases ended; :meth:`records` is the
    list itself (a user may clear or edit it), with every raw record made
    into ``Delta`` objects first."""

    __slots__ = ("_records", "_pending", "_reading")

    def __init__(self) -> None:
        self._records: List[Record] = []
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
        pending = self._pending
        if pending:
            with self._reading:
                # The first n records, copied and then removed, each in one
                # step under the GIL: a step the training thread adds
                # meanwhile stays for the next read.
                n = len(pending)
                self._records.extend((p, i, deltas_of(d) if isinstance(d, tuple) else d) for p, i, d in pending[:n])
                del pending[:n]
        return self._records

    def replace(self, records: Union[List[Record], "History"]) -> None:
        """``owner.history = [...]``: the list given becomes the history."""
        with self._reading:
            del self._pending[:]
        self._records = records.records() if isinstance(records, History) else records
