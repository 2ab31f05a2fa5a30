"""The highest value across ranks, for the integrations' logs: one small
``all_reduce(MAX)`` of a few int64s over ``torch.distributed`` at a logging
interval (never per step), only when a process group is initialised with
more than one rank. With one rank, or no ``torch.distributed``, the values
are returned as they are, and torch is never imported.

Every rank must call at the same points with the same number of values (a
collective): the integrations call at their logging interval, which every
rank reaches at the same step."""

from __future__ import annotations

import sys
from typing import Any, List, Optional, Sequence, Tuple

from ..windows import Delta

#: The Delta fields carried across ranks, in this order.
_FIELDS = ("used_start", "used_end", "peak", "delta_used", "delta_peaked")


def _dist() -> Any:
    """``torch.distributed`` when a process group of more than one rank is
    initialised in this process, else None (torch not imported: none)."""
    if "torch" not in sys.modules:
        return None
    dist = getattr(sys.modules["torch"], "distributed", None)
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        if int(dist.get_world_size()) <= 1:
            return None
    except Exception:  # noqa: BLE001 - a torch built without distributed support
        return None
    return dist


def world() -> Optional[Tuple[int, int]]:
    """``(rank, world_size)`` of the initialised process group when it has
    more than one rank, else None."""
    dist = _dist()
    if dist is None:
        return None
    return int(dist.get_rank()), int(dist.get_world_size())


def max_across_ranks(values: Sequence[int]) -> List[int]:
    """The element-wise maximum of ``values`` over every rank (one
    ``all_reduce`` of int64s on the backend's device: the current CUDA
    device under NCCL, the CPU otherwise); ``values`` unchanged with one
    rank."""
    out = [int(v) for v in values]
    dist = _dist()
    if dist is None or not out:
        return out
    torch = sys.modules["torch"]
    device = "cpu"
    backend = str(dist.get_backend())
    if "nccl" in backend.lower():
        device = f"cuda:{torch.cuda.current_device()}"
    t = torch.tensor(out, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def pack(deltas: Sequence[Delta]) -> List[int]:
    """A Delta list as int64s, for :func:`max_across_ranks`."""
    return [getattr(d, f) for d in deltas for f in _FIELDS]


def unpack(values: Sequence[int], like: Sequence[Delta]) -> List[Delta]:
    """Deltas from :func:`pack`'s layout (kinds and fidelities from ``like``)."""
    n = len(_FIELDS)
    out: List[Delta] = []
    for i, d in enumerate(like):
        fields = dict(zip(_FIELDS, values[i * n : (i + 1) * n]))
        out.append(Delta(kind=d.kind, fidelity=d.fidelity, **fields))
    return out


def max_deltas(deltas: Sequence[Delta], extra: Sequence[int] = ()) -> Tuple[List[Delta], List[int]]:
    """Every field of ``deltas``, and ``extra``, at its maximum across ranks,
    in one ``all_reduce`` (unchanged with one rank)."""
    values = max_across_ranks(pack(deltas) + list(extra))
    n = len(deltas) * len(_FIELDS)
    return unpack(values[:n], deltas), values[n:]


class RankMaxima:
    """What an integration keeps of the ranks: its own rank and the world
    size (None and 1 without a process group), and the history of the
    maxima it logged, ``(phase, index, [Delta, ...])`` like its own
    ``history`` (empty with one rank: the own history is the maxima)."""

    def __init__(self) -> None:
        self.history: List[Tuple[str, int, List[Delta]]] = []
        self.rank: Optional[int] = None
        self.world_size = 1

    def reduce(
        self, phase: str, index: int, deltas: Sequence[Delta], extra: Sequence[int] = (), keep: bool = True
    ) -> Tuple[List[Delta], List[int]]:
        """``deltas`` and ``extra`` at their maximum across ranks, kept in
        the history when there are several ranks."""
        w = world()
        if w is None:
            return list(deltas), list(extra)
        self.rank, self.world_size = w
        maxima, rest = max_deltas(deltas, extra)
        if keep:
            self.history.append((phase, index, maxima))
        return maxima, rest
