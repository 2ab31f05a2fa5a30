"""The live part: turns torch's history on, and at every step that sets a
new peak for its epoch takes ONE snapshot and replays it; at the epoch's
end writes the table. A :class:`memprobe.Tracker` observer (its callback
sink), so every integration built on the tracker gets it at once."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import record as rec_mod
from .modules import ModuleTimeline
from .options import AttributionOptions
from .replay import Block, Replay, device_trace, fragmentation, live_blocks, replay_peak

log = logging.getLogger("memprobe.attribution")

#: Attributions recording now (torch's history is one per process: it is
#: turned off when the last one closes).
_ACTIVE: List["Attribution"] = []
_LOCK = threading.Lock()

#: Exceptions kept in :attr:`Attribution.errors`: a failure repeats at every
#: step, and each kept exception's traceback holds its frames' locals (a
#: whole snapshot of torch's history), so only the first few stay.
MAX_ERRORS = 16


class AttributionWarning(RuntimeWarning):
    """Attribution was asked for but cannot run (no PyTorch allocator source,
    a torch without ``_record_memory_history``), or failed during a step
    (training goes on; :attr:`Attribution.errors` keeps the first
    exceptions, :attr:`Attribution.failures` counts them all)."""


def _devices(sources: Sequence[Any]) -> Dict[int, int]:
    """``torch_alloc:N`` source -> (device N: its index among ``sources``)."""
    out: Dict[int, int] = {}
    for i, s in enumerate(sources):
        name = getattr(s, "name", "")
        if name.startswith("torch_alloc:"):
            try:
                out.setdefault(int(name.split(":", 1)[1]), i)
            except ValueError:
                pass
    return out


class Attribution:
    """Which tensors made each epoch's peak (see the package's
    documentation). Made by a :class:`memprobe.Tracker` given
    ``attribution=``; read it as ``tracker.attribution``:

    - ``epochs``: epoch index -> its record (the device with the highest
      peak when the tracker measures several);
    - ``records``: every record written, epochs and out-of-memory errors,
      in order; ``files``: their paths;
    - ``snapshots``: snapshots taken (one per step that set a new epoch
      peak); ``cost_ms``: their total cost (snapshot + replay + record);
    - ``lines``: the one log line per epoch (also logged, INFO, on the
      ``memprobe.attribution`` logger);
    - ``errors``: the first :data:`MAX_ERRORS` exceptions attribution
      caught (training goes on); ``failures``: how many in all."""

    def __init__(self, options: AttributionOptions, sources: Sequence[Any]):
        self.options = options
        self.devices = _devices(sources)
        self.snapshots = 0
        self.cost_ms = 0.0
        self.epochs: Dict[int, Dict[str, Any]] = {}
        self.records: List[Dict[str, Any]] = []
        self.files: List[str] = []
        self.lines: List[str] = []
        self.errors: List[BaseException] = []
        self.failures = 0
        self.active = False
        #: A custom phase that is a step and an epoch at once (the
        #: notebook's ``cell``: a table per cell), else None.
        self.cell_phase: Optional[str] = None
        #: The ``stage`` of the records.
        self.stage = "train"
        self._ooms = 0
        self._epoch = 0  # the epoch running (epochs ended so far)
        # Per device: this epoch's highest step peak and its record.
        self._best: Dict[int, Tuple[int, Dict[str, Any]]] = {}
        self._since_us: Optional[int] = None
        self._timeline: Optional[ModuleTimeline] = None
        self._torch: Any = None
        self._start()

    # --- recording ---------------------------------------------------------------

    def _start(self) -> None:
        if not self.devices:
            warnings.warn(
                AttributionWarning(
                    "attribution needs PyTorch's allocator sources (torch_alloc:N) among the tracker's "
                    "sources: CUDA was not initialised when they were chosen, or torch_sources=False. "
                    "Attribution is off"
                ),
                stacklevel=4,
            )
            return
        torch = sys.modules.get("torch")
        memory = getattr(getattr(torch, "cuda", None), "memory", None)
        record = getattr(memory, "_record_memory_history", None)
        if record is None or getattr(memory, "_snapshot", None) is None:
            warnings.warn(
                AttributionWarning(
                    f"torch {getattr(torch, '__version__', '?')} has no torch.cuda.memory._record_memory_history "
                    "/ _snapshot (torch >= 2.1): attribution is off"
                ),
                stacklevel=4,
            )
            return
        record(
            enabled="all",
            context="all",
            stacks="all" if self.options.cpp_stacks else "python",
            max_entries=int(self.options.max_entries),
        )
        self._torch = torch
        self._since_us = time.time_ns() // 1000
        if self.options.modules:
            self._timeline = ModuleTimeline()
            try:
                self._timeline.install(torch)
            except Exception as e:  # noqa: BLE001 - frameless blocks stay unnamed
                self._keep(e)
        with _LOCK:
            _ACTIVE.append(self)
        self.active = True
        from .. import torch as torch_integration

        torch_integration.watch_oom(self)

    def _snapshot(self) -> Dict[str, Any]:
        snap: Dict[str, Any] = self._torch.cuda.memory._snapshot()
        self.snapshots += 1
        return snap

    def _module_at(self, time_us: Optional[int]) -> Optional[str]:
        return self._timeline.module_at(time_us) if self._timeline is not None else None

    # --- the tracker's observer ----------------------------------------------------

    def on_record(self, record: Any, deltas: Any = None) -> None:
        """Every ended phase: a :class:`memprobe.PhaseRecord`, or the
        library's own record and delta array as its callback gives them
        (``deltas``: read only at the devices' sources, no object built for
        the others: this runs at every step)."""
        if not self.active:
            return
        try:
            kind = int(record.kind)
            if kind == 0:
                self._step(record, record.deltas if deltas is None else deltas)
            elif kind == 1:
                self._epoch_end(int(record.index))
            elif kind == 4 and self.cell_phase is not None and _name(record.name) == self.cell_phase:
                self._step(record, record.deltas if deltas is None else deltas)
                self._epoch_end(self._epoch)
        except Exception as e:  # noqa: BLE001 - never stop the training
            self._failed(e)

    def _keep(self, e: BaseException) -> None:
        self.failures += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(e)

    def _failed(self, e: BaseException) -> None:
        self._keep(e)
        if self.failures == 1:
            warnings.warn(AttributionWarning(f"attribution failed: {type(e).__name__}: {e}"), stacklevel=2)

    def _step(self, rec: Any, deltas: Any) -> None:
        new: List[Tuple[int, int]] = []
        for device, i in self.devices.items():
            peak = int(deltas[i].peak)
            best = self._best.get(device)
            if best is None or peak > best[0]:
                new.append((device, peak))
        if not new:
            return
        t0 = time.perf_counter()
        snap = self._snapshot()
        # memprobe's boundaries are CLOCK_MONOTONIC, torch's history Unix
        # time: one offset, read now.
        offset = time.time_ns() - time.monotonic_ns()
        start_us = (int(rec.started_at_ns) + offset) // 1000 if rec.started_at_ns else None
        end_us = (int(rec.ended_at_ns) + offset) // 1000 + 1 if rec.ended_at_ns else None
        for device, peak in new:
            replay = replay_peak(
                snap,
                device,
                start_us=start_us,
                end_us=end_us,
                peak_bytes=peak,
                max_entries=self.options.max_entries,
                recording_since_us=self._since_us,
            )
            built = rec_mod.build(
                replay,
                kind="epoch_peak",
                top=self.options.top,
                peak_bytes=peak,
                epoch=self._epoch,
                step=int(rec.index),
                stage=self.stage,
                module_at=self._module_at,
            )
            self._best[device] = (peak, built)
        cost = (time.perf_counter() - t0) * 1e3
        self.cost_ms += cost
        for device, _ in new:
            self._best[device][1]["cost_ms"] = round(cost, 3)

    def _epoch_end(self, index: int) -> None:
        best, self._best = self._best, {}
        self._epoch = index + 1
        if not best:
            return
        # The device with the highest peak takes the contract's name (what
        # memprobe run reads); another device of this process adds its own.
        first = max(sorted(best), key=lambda d: best[d][0])
        for device in [first] + [d for d in sorted(best) if d != first]:
            record = best[device][1]
            record["epoch"] = index
            self._write(record, "epoch_peak", index, None if device == first else device)
        top = best[first][1]
        self.epochs[index] = top
        line = summary_line(top)
        self.lines.append(line)
        log.info("%s", line)

    def _write(self, record: Dict[str, Any], kind: str, index: int, device: Optional[int]) -> Optional[str]:
        """Writes ``record``; its path, or None when it could not be written."""
        self.records.append(record)
        folder = rec_mod.directory(self.options.directory)
        path = os.path.join(folder, rec_mod.file_name(kind, index, int(record["rank"]), device))
        try:
            written = rec_mod.write(record, path)
        except OSError as e:
            self._failed(e)
            return None
        self.files.append(written)
        return written

    # --- out of memory ------------------------------------------------------------

    def on_oom(self, device: int, requested: int) -> Optional[str]:
        """PyTorch gave up on an allocation of ``requested`` bytes on
        ``device``: what was live (the table), the request, each segment's
        fragmentation, written as an ``oom`` record. Returns its path."""
        if not self.active:
            return None
        try:
            t0 = time.perf_counter()
            snap = self._snapshot()
            blocks = sorted(live_blocks(snap, device).values(), key=lambda b: (-b.bytes, b.address))
            trace = device_trace(snap, device)
            # Frames of the blocks the snapshot names without them.
            _frames_from_trace(blocks, trace)
            lost = len(trace) >= self.options.max_entries
            allocated = sum(b.bytes for b in blocks)
            replay = Replay(device, True, len(trace), lost, allocated, blocks)
            index = self._ooms
            self._ooms += 1
            record = rec_mod.build(
                replay,
                kind="oom",
                top=self.options.top,
                peak_bytes=allocated,
                epoch=self._epoch,
                stage=self.stage,
                requested_bytes=int(requested),
                segments=fragmentation(snap, device),
                module_at=self._module_at,
            )
            cost = (time.perf_counter() - t0) * 1e3
            record["cost_ms"] = round(cost, 3)
            self.cost_ms += cost
            # Not files[-1]: when this write fails, that is an earlier record.
            return self._write(record, "oom", index, None)
        except Exception as e:  # noqa: BLE001 - never replace torch's own error
            self._failed(e)
            return None

    # --- the end --------------------------------------------------------------------

    def close(self) -> None:
        """Ends attribution: a loop without epochs gets its table written as
        one epoch; torch's history is turned off when no other attribution
        records."""
        if not self.active:
            return
        try:
            if self._best:
                self._epoch_end(self._epoch)
        except Exception as e:  # noqa: BLE001
            self._failed(e)
        self.active = False
        if self._timeline is not None:
            self._timeline.close()
        with _LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            last = not _ACTIVE
        if last:
            try:
                self._torch.cuda.memory._record_memory_history(enabled=None)
            except Exception as e:  # noqa: BLE001
                self._keep(e)


def _name(name: Any) -> str:
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


def _frames_from_trace(blocks: List[Block], trace: Sequence[Dict[str, Any]]) -> None:
    want = {b.address: b for b in blocks if b.time_us is None}
    for e in reversed(trace):
        if not want:
            break
        if e.get("action") == "alloc":
            b = want.pop(int(e.get("addr", 0) or 0), None)
            if b is not None:
                b.time_us = int(e.get("time_us", 0) or 0)
                if not b.frames:
                    b.frames = list(e.get("frames") or [])


def _mib(n: Optional[int]) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


def summary_line(record: Dict[str, Any]) -> str:
    """One line for an epoch: its peak, the step, the top blocks."""
    head = (
        f"memprobe: epoch {record['epoch']} peak {_mib(record['peak_bytes'])} on cuda:{record['device']} "
        f"at step {record['step']}"
    )
    if not record["history"]["complete"]:
        return f"{head}: blocks unknown ({record['history'].get('reason', 'history incomplete')})"
    parts = []
    for b in record["blocks"][:3]:
        f = b["frames"][0] if b["frames"] else None
        where = f"{os.path.basename(f['file'])}:{f['line']} {f['function']}" if f else (b["module"] or "no frame")
        parts.append(f"{_mib(b['bytes'])} {where}")
    rest = record["rest"]
    parts.append(f"rest {_mib(rest['bytes'])} in {rest['blocks']} blocks")
    return f"{head}: " + ", ".join(parts)
