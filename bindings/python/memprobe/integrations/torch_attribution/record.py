"""The attribution record: one JSON object per epoch's peak step (or per
PyTorch out-of-memory error), the format ``memprobe run`` and the C++
header read (schema ``memprobe.torch_attribution/1``)::

    {"schema": "memprobe.torch_attribution/1", "kind": "epoch_peak" | "oom",
     "rank": 0, "epoch": 2, "step": 812, "stage": "train", "device": 0,
     "peak_bytes": ..., "requested_bytes": null,
     "blocks": [{"bytes", "stream", "address", "frames": [{"file", "line",
                 "function"}], "module"}],
     "rest": {"bytes", "blocks", "unplaced_bytes"},
     "segments": null, "history": {"complete", "entries", "lost_entries"},
     "cost_ms": 3.2}

``blocks`` bytes + ``rest.bytes`` == ``peak_bytes`` whenever
``history.complete``; otherwise ``blocks`` is empty and ``rest.bytes``
null. ``rest.unplaced_bytes``: the part of ``rest`` that the replay could
not place in any block (blocks freed before the snapshot whose allocator
size torch's history does not record). A record is at most 256 KiB: the
frames are trimmed first, then blocks move into ``rest`` (``"truncated":
true``). Files are written whole (a temporary name, then a rename)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, Dict, List, Optional

from .frames import user_frames
from .replay import Replay

SCHEMA = "memprobe.torch_attribution/1"

#: The largest record, bytes.
MAX_BYTES = 256 * 1024

#: The environment variable naming the directory (``memprobe run`` sets it).
DIR_ENV = "MEMPROBE_ATTRIBUTION_DIR"

#: Where records go when neither the option nor the variable names a
#: directory: beside the run's logs, in the working directory.
DEFAULT_DIR = "memprobe-attribution"


def rank() -> int:
    """This process's rank (``RANK``, else 0)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def directory(option: Optional[str]) -> str:
    """Where records go: ``MEMPROBE_ATTRIBUTION_DIR`` when set (``memprobe
    run`` reads them there), else the option's directory, else
    ``./memprobe-attribution``."""
    return os.environ.get(DIR_ENV) or option or DEFAULT_DIR


def build(
    replay: Replay,
    *,
    kind: str,
    top: int,
    peak_bytes: Optional[int],
    epoch: Optional[int] = None,
    step: Optional[int] = None,
    stage: Optional[str] = None,
    requested_bytes: Optional[int] = None,
    segments: Optional[List[Dict[str, int]]] = None,
    module_at: Optional[Callable[[Optional[int]], Optional[str]]] = None,
    cost_ms: float = 0.0,
    rank_: Optional[int] = None,
) -> Dict[str, Any]:
    """The record of ``replay``: its ``top`` largest blocks with their
    frames (the user's first) and one ``rest`` line summing the others."""
    blocks: List[Dict[str, Any]] = []
    rest: Dict[str, Any] = {"bytes": None, "blocks": None, "unplaced_bytes": None}
    if replay.complete:
        shown = replay.blocks[: max(int(top), 0)]
        for b in shown:
            frames = user_frames(b.frames)
            module = None
            if not frames and module_at is not None:
                module = module_at(b.time_us)
            blocks.append(
                {"bytes": b.bytes, "stream": b.stream, "address": b.address, "frames": frames, "module": module}
            )
        others = replay.blocks[len(shown) :]
        total = peak_bytes if peak_bytes is not None else replay.replay_bytes
        named = sum(b["bytes"] for b in blocks)
        rest = {
            "bytes": (total or 0) - named,
            "blocks": len(others),
            "unplaced_bytes": max((total or 0) - (replay.replay_bytes or 0), 0),
        }
    record: Dict[str, Any] = {
        "schema": SCHEMA,
        "kind": kind,
        "rank": rank() if rank_ is None else rank_,
        "epoch": epoch,
        "step": step,
        "stage": stage,
        "device": replay.device,
        "peak_bytes": peak_bytes,
        "requested_bytes": requested_bytes,
        "blocks": blocks,
        "rest": rest,
        "segments": segments,
        "history": {"complete": replay.complete, "entries": replay.entries, "lost_entries": replay.lost_entries},
        "cost_ms": round(float(cost_ms), 3),
    }
    if replay.reason:
        record["history"]["reason"] = replay.reason
    return bounded(record)


def _size(record: Dict[str, Any]) -> int:
    return len(json.dumps(record, separators=(",", ":")).encode())


def bounded(record: Dict[str, Any], limit: int = MAX_BYTES) -> Dict[str, Any]:
    """``record`` within ``limit`` bytes of JSON: frames trimmed first (each
    block keeps its innermost user frame), then the smallest blocks moved
    into ``rest``, then the segments list dropped; ``"truncated": true``
    when anything went."""
    if _size(record) <= limit:
        return record
    record["truncated"] = True
    blocks = record["blocks"]
    for keep in (2, 1):
        for b in blocks:
            del b["frames"][keep:]
            for f in b["frames"]:
                f["file"] = f["file"][-256:]
                f["function"] = f["function"][-128:]
        if _size(record) <= limit:
            return record
    while blocks and _size(record) > limit:
        # Halve the blocks shown until it fits: the smallest go to rest.
        cut = max(len(blocks) // 2, 1)
        gone = blocks[-cut:]
        del blocks[-cut:]
        rest = record["rest"]
        if rest.get("bytes") is not None:
            rest["bytes"] += sum(b["bytes"] for b in gone)
            rest["blocks"] += len(gone)
    if record.get("segments") and _size(record) > limit:
        segs = record["segments"]
        while segs and _size(record) > limit:
            del segs[len(segs) // 2 :]
    return record


def write(record: Dict[str, Any], path: str) -> str:
    """Writes ``record`` to ``path`` whole: a temporary file in the same
    directory, then a rename (a reader never sees part of a record)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".attribution-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, separators=(",", ":"))
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def file_name(kind: str, index: int, rank_: int, device: Optional[int] = None) -> str:
    """``epoch-<E>-rank-<R>.json`` / ``oom-<N>-rank-<R>.json``; the other
    devices of a process that measures several add ``-device-<D>`` (the
    device with the epoch's highest peak keeps the plain name)."""
    base = f"{'epoch' if kind == 'epoch_peak' else 'oom'}-{index}-rank-{rank_}"
    return f"{base}-device-{device}.json" if device is not None else f"{base}.json"
