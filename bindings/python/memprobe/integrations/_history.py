"""An integration's ``history`` of ended phases, ``(phase, index, [Delta,
...])``, whose per-step records are kept as the boundary read them
(:data:`memprobe.windows.RawDeltas`, plain integers) and made into
:class:`Delta` objects when the history is read: building them is a third
of a training step's boundary when the step runs cold, and most steps'
records are never read during training."""

from __future__ import annotations

from typing import List, Tuple, Union

from ..windows import Delta, RawDeltas, deltas_of

Record = Tuple[str, int, List[Delta]]


class History:
    """The records in the order their phases ended; :meth:`records` is the
    list itself (a user may clear or edit it), with every raw record made
    into ``Delta`` objects first."""

    __slots__ = ("_records", "_raw")

    def __init__(self) -> None:
        self._records: List[Record] = []
        # Raw records that come after every one in _records.
        self._raw: List[Tuple[str, int, RawDeltas]] = []

    def add(self, phase: str, index: int, deltas: List[Delta]) -> Record:
        rec = (phase, index, deltas)
        self.records().append(rec)
        return rec

    def add_raw(self, phase: str, index: int, raw: RawDeltas) -> None:
        self._raw.append((phase, index, raw))

    def records(self) -> List[Record]:
        if self._raw:
            self._records.extend((p, i, deltas_of(r)) for p, i, r in self._raw)
            self._raw = []
        return self._records

    def replace(self, records: Union[List[Record], "History"]) -> None:
        """``owner.history = [...]``: the list given becomes the history."""
        self._raw = []
        self._records = records.records() if isinstance(records, History) else records
