"""Replays PyTorch's allocator history to the moment of a step's peak.

Input: the dictionary ``torch.cuda.memory._snapshot()`` returns —
``"segments"`` (each with ``"device"``, ``"stream"``, ``"blocks"``: their
``"address"``, ``"size"``, ``"state"``, ``"frames"``) and ``"device_traces"``
(one list per device of entries ``{"action", "addr", "size", "stream",
"time_us", "frames"}``, oldest first, at most ``max_entries`` of them: a
ring buffer that drops the oldest).

The snapshot is the state *now* (the step's end). Walking the trace back
from it, undoing each entry, gives the allocated blocks at every moment of
the step; the moment with the most allocated bytes is the peak. torch's
``allocated_bytes`` (memprobe's ``torch_alloc:N``) falls at
``free_requested`` (the block is no longer the caller's, even while a
stream still uses it) and rises at ``alloc``; ``free_completed`` and the
``segment_*`` actions move reserved memory only.

Sizes: a block live at the snapshot has its exact size there. A block freed
before the snapshot is known from the trace, which records the size the
caller asked for; the allocator's block is that size rounded up to 512
bytes (or larger when a cached block was not split: torch keeps no record
of that). So the replay never exceeds the true figure; what it cannot
place is said (``unplaced_bytes``), never spread over blocks.

When the ring buffer no longer reaches back to the step's start, the state
at the start is unknown: the replay says so (``complete`` False) and names
no block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: torch's smallest block (c10's kMinBlockSize): every size is rounded up to it.
MIN_BLOCK = 512

#: Actions that change allocated bytes (torch_alloc).
_ALLOC = "alloc"
_FREE_REQUESTED = "free_requested"


def block_size(requested: int) -> int:
    """The caching allocator's block for a request (c10's ``round_size``
    without ``roundup_power2_divisions``): at least 512 bytes, a multiple
    of 512."""
    if requested < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * ((requested + MIN_BLOCK - 1) // MIN_BLOCK)


Frame = Dict[str, Any]


@dataclass
class Block:
    """A block live at the peak: where, how big, which stream, the frames of
    the call that allocated it (torch's, innermost first; empty when the
    trace and the snapshot give none) and when (torch's ``time_us``; None
    when allocated before the history)."""

    address: int
    bytes: int
    stream: int
    frames: List[Frame] = field(default_factory=list)
    time_us: Optional[int] = None
    #: Size from the snapshot (exact) or rounded from the trace's request.
    exact: bool = True


@dataclass
class Replay:
    """The live blocks at a step's peak (largest first), or why not."""

    device: int
    complete: bool
    entries: int
    lost_entries: bool
    #: Replayed allocated bytes at the peak (sum of ``blocks``).
    replay_bytes: Optional[int]
    blocks: List[Block]
    #: Trace index of the peak (the state after that entry; -1: the step's
    #: start, before its first entry).
    peak_index: Optional[int] = None
    #: Why the replay is incomplete.
    reason: Optional[str] = None


def _time(entry: Dict[str, Any]) -> int:
    return int(entry.get("time_us", 0) or 0)


def _entry_frames(entry: Dict[str, Any]) -> List[Frame]:
    frames = entry.get("frames")
    return list(frames) if frames else []


def _block_frames(block: Dict[str, Any]) -> List[Frame]:
    frames = block.get("frames")
    if frames:
        return list(frames)
    history = block.get("history")  # torch < 2.1
    if history:
        return list(history[-1].get("frames") or [])
    return []


def live_blocks(snapshot: Dict[str, Any], device: int) -> Dict[int, Block]:
    """The blocks allocated on ``device`` at the snapshot, by address
    (``active_allocated``: a block whose free is requested but not completed
    no longer counts in torch's allocated bytes)."""
    out: Dict[int, Block] = {}
    for seg in snapshot.get("segments") or ():
        if int(seg.get("device", 0)) != device:
            continue
        stream = int(seg.get("stream", 0) or 0)
        for b in seg.get("blocks") or ():
            if b.get("state") != "active_allocated":
                continue
            addr = int(b["address"])
            out[addr] = Block(addr, int(b["size"]), stream, _block_frames(b))
    return out


def device_trace(snapshot: Dict[str, Any], device: int) -> Sequence[Dict[str, Any]]:
    """``device``'s history, oldest first (the snapshot's own list: read, never changed)."""
    traces = snapshot.get("device_traces") or []
    if 0 <= device < len(traces):
        return traces[device] or []
    return []


def _step_range(trace: Sequence[Dict[str, Any]], start_us: Optional[int], end_us: Optional[int]) -> Tuple[int, int]:
    """[first, last) trace indices inside the step: entries at or after
    ``start_us`` and at or before ``end_us``."""
    n = len(trace)
    last = n
    if end_us is not None:
        while last > 0 and _time(trace[last - 1]) > end_us:
            last -= 1
    first = last
    if start_us is None:
        first = 0
    else:
        while first > 0 and _time(trace[first - 1]) >= start_us:
            first -= 1
    return first, last


def _undo_size(sizes: Dict[int, int], entry: Dict[str, Any]) -> int:
    """Undoes ``entry`` on ``sizes`` (address -> bytes allocated after it
    becomes the state before it); returns the change of allocated bytes
    (before - after). An allocation not live after itself (a trace that
    disagrees with the snapshot) takes nothing back."""
    action = entry.get("action")
    if action == _ALLOC:
        return -sizes.pop(entry.get("addr", 0) or 0, 0)
    if action == _FREE_REQUESTED:
        size = block_size(entry.get("size", 0) or 0)
        sizes[entry.get("addr", 0) or 0] = size
        return size
    return 0


def replay_peak(
    snapshot: Dict[str, Any],
    device: int,
    *,
    start_us: Optional[int],
    end_us: Optional[int] = None,
    peak_bytes: Optional[int] = None,
    max_entries: Optional[int] = None,
    recording_since_us: Optional[int] = None,
) -> Replay:
    """The blocks live at the peak of the step that ran from ``start_us`` to
    ``end_us`` (torch's clock: Unix microseconds) on ``device``.

    ``peak_bytes``: memprobe's exact peak of ``torch_alloc:<device>`` for
    the step; a moment whose replayed bytes exceed it lies outside the step
    (a clock tie at its edge) and is not taken. ``max_entries``: the ring
    buffer's size; ``recording_since_us``: when the history began (None:
    unknown). The history is complete when an entry older than the step's
    start is still there, or when the ring never filled and recording began
    before the step."""
    trace = device_trace(snapshot, device)
    n = len(trace)
    first, last = _step_range(trace, start_us, end_us)
    reaches_back = start_us is not None and first > 0
    never_dropped = (max_entries is None or n < max_entries) and (
        recording_since_us is not None and start_us is not None and recording_since_us <= start_us
    )
    lost = max_entries is not None and n >= max_entries
    if start_us is None or not (reaches_back or never_dropped):
        reason = (
            "the step's start is unknown"
            if start_us is None
            else "torch's history (a ring buffer of max_entries) no longer reaches back to the step's start"
            if lost
            else "torch's history began after the step's start"
        )
        return Replay(device, False, n, lost, None, [], None, reason)

    # Pass 1: allocated bytes at every moment of the step, from now back.
    live = live_blocks(snapshot, device)
    scratch = {a: b.bytes for a, b in live.items()}
    total = sum(scratch.values())
    for i in range(n - 1, last - 1, -1):  # entries after the step's end
        total += _undo_size(scratch, trace[i])
    best: Optional[int] = None
    best_index: Optional[int] = None
    # The state after entry i, for i from last-1 down to first-1 (-1 for
    # first == 0 means the state before the whole trace, which is the
    # step's start only when the history reaches back).
    for i in range(last - 1, first - 2, -1):
        if peak_bytes is None or total <= peak_bytes:
            if best is None or total >= best:  # ties: the earliest moment
                best, best_index = total, i
        if i >= first:
            total += _undo_size(scratch, trace[i])
    if best is None or best_index is None:
        return Replay(device, False, n, lost, None, [], None, "no moment of the step fits its peak")

    # Pass 2: the blocks at that moment (sizes first; a Block only for
    # what is live there).
    sizes = {a: b.bytes for a, b in live.items()}
    relived: Dict[int, Dict[str, Any]] = {}  # address -> the free undone
    for i in range(n - 1, best_index, -1):
        e = trace[i]
        action = e.get("action")
        if action == _ALLOC:
            addr = e.get("addr", 0) or 0
            sizes.pop(addr, None)
            relived.pop(addr, None)
        elif action == _FREE_REQUESTED:
            addr = e.get("addr", 0) or 0
            sizes[addr] = block_size(e.get("size", 0) or 0)
            relived[addr] = e
    at_peak: Dict[int, Block] = {}
    for addr, size in sizes.items():
        freed = relived.get(addr)
        if freed is None:
            at_peak[addr] = live[addr]
        else:
            at_peak[addr] = Block(int(addr), size, int(freed.get("stream", 0) or 0), [], None, exact=False)
    live = at_peak
    # Frames of blocks allocated before the peak: found further back.
    pending = {a for a, b in live.items() if b.time_us is None}
    for i in range(best_index, -1, -1):
        if not pending:
            break
        e = trace[i]
        if e.get("action") != _ALLOC:
            continue
        addr = int(e.get("addr", 0) or 0)
        if addr in pending:
            b = live[addr]
            if not b.frames:
                b.frames = _entry_frames(e)
            b.time_us = _time(e)
            if e.get("stream") is not None:
                b.stream = int(e.get("stream") or 0)
            pending.discard(addr)
    blocks = sorted(live.values(), key=lambda b: (-b.bytes, b.address))
    return Replay(device, True, n, lost, sum(b.bytes for b in blocks), blocks, best_index)


def fragmentation(snapshot: Dict[str, Any], device: int) -> List[Dict[str, int]]:
    """Each segment of ``device``: address, bytes reserved, bytes allocated
    in it, stream (reserved - allocated is its fragmentation)."""
    out = []
    for seg in snapshot.get("segments") or ():
        if int(seg.get("device", 0)) != device:
            continue
        out.append(
            {
                "address": int(seg.get("address", 0) or 0),
                "bytes": int(seg.get("total_size", 0) or 0),
                "allocated": int(seg.get("allocated_size", 0) or 0),
                "stream": int(seg.get("stream", 0) or 0),
            }
        )
    return out
