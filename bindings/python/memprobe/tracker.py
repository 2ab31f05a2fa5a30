"""The training-loop tracker: nested phases (step, epoch, experience,
stream, custom) over a set of sources, one record per ended phase, sinks
(fastai's PeakMemMetric table, JSON Lines, CSV, a Python callback),
cache-release policies (ClearCacheHook), out-of-memory retry
(gpu_mem_restore) and leak trends::

    tracker = memprobe.Tracker([rss, tree])
    tracker.add_table_sink("epoch")               # one row per epoch, like PeakMemMetric
    tracker.add_release(torch_release)            # e.g. integrations.torch.empty_cache_release()
    tracker.release_every("step", 100)
    for epoch in range(3):
        with tracker.epoch():
            for batch in loader:
                with tracker.step() as step:
                    train(batch)
                print(step.record.deltas[0].peak)
"""

from __future__ import annotations

import ctypes
import enum
import os
import struct
import sys
from ctypes import byref, c_bool, c_int64, c_uint32, c_uint64
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from . import _deprecated, _ffi
from ._ffi import C, check
from ._owned import Owned
from .errors import Status
from .sources import Source, as_sources, check_over
from .windows import _DELTA_FORMAT, Delta, RawDeltas, _result_array


class PhaseKind(enum.IntEnum):
    """``memprobe_phase_kind``: a training-loop phase."""

    STEP = 0
    EPOCH = 1
    EXPERIENCE = 2
    STREAM = 3
    CUSTOM = 4


Kind = Union[PhaseKind, int, str]

#: The built-in kinds that need no name, by every spelling ``_kind`` reads
#: the same way (a PhaseKind, its value, its lowercase name): the lookup at
#: every boundary.
_BUILTIN_KINDS: Dict[Any, int] = {}
for _k in (PhaseKind.STEP, PhaseKind.EPOCH, PhaseKind.EXPERIENCE, PhaseKind.STREAM):
    _BUILTIN_KINDS[_k] = int(_k)
    _BUILTIN_KINDS[_k.name.lower()] = int(_k)
del _k

#: PhaseKind by value (``_enum(PhaseKind, v)`` without its exception path).
_PHASE_KINDS: Dict[int, Any] = {int(k): k for k in PhaseKind}


def _kind(kind: Kind, name: Optional[str]) -> Tuple[int, Optional[bytes]]:
    """(kind code, name) from a PhaseKind, or a string: a kind's name
    ("step", "epoch", ...) or any other name for a custom phase."""
    if name is None:
        # The common case at every boundary: a built-in kind, no name.
        hit = _BUILTIN_KINDS.get(kind)
        if hit is not None:
            return hit, None
    if isinstance(kind, str):
        try:
            k = PhaseKind[kind.upper()]
        except KeyError:
            if name is not None:
                raise ValueError(f"unknown phase kind {kind!r}") from None
            return PhaseKind.CUSTOM, kind.encode()
        if k is PhaseKind.CUSTOM:
            if name is None:
                raise ValueError("a custom phase needs a name")
        return int(k), (name.encode() if name is not None else None)
    return int(kind), (name.encode() if name is not None else None)


@dataclass(frozen=True)
class PhaseRecord:
    """The record of an ended phase: timing, releases, leaks and one
    :class:`Delta` per source (start, end, peak, fastai's deltas)."""

    kind: PhaseKind
    name: str
    #: Enclosing phases still open (0 = outermost).
    depth: int
    #: 0-based count of phases of this kind (and name) ended before it.
    index: int
    started_at_ns: int
    ended_at_ns: int
    duration_ns: int
    #: Cache releases fired at the end of this phase.
    n_releases: int
    #: Bit i set: source i is flagged as leaking.
    leak_flags: int
    #: Bytes freed by this phase's releases, summed over sources.
    released_bytes: int
    deltas: Tuple[Delta, ...] = field(default=())

    @property
    def leaking(self) -> List[int]:
        """Indices of the sources flagged as leaking."""
        return [i for i in range(min(len(self.deltas), 64)) if self.leak_flags >> i & 1]

    @property
    def duration(self) -> float:
        """Seconds."""
        return self.duration_ns / 1e9

    @classmethod
    def _from_c(cls, r: _ffi.memprobe_phase_record, deltas: Iterable[Any]) -> "PhaseRecord":
        # Built at every step boundary: fill the frozen instance's __dict__
        # directly, as Delta._from_c does (the generated __init__ sets the
        # fields one by one through object.__setattr__, several times slower).
        obj = cls.__new__(cls)
        obj.__dict__.update(
            kind=_PHASE_KINDS.get(r.kind, r.kind),
            name=r.name.decode("utf-8", "replace"),
            depth=r.depth,
            index=r.index,
            started_at_ns=r.started_at_ns,
            ended_at_ns=r.ended_at_ns,
            duration_ns=r.duration_ns,
            n_releases=r.n_releases,
            leak_flags=r.leak_flags,
            released_bytes=r.released_bytes,
            deltas=tuple([Delta._from_c(d) for d in deltas]),
        )
        return obj


@dataclass(frozen=True)
class LeakStatus:
    """A source's leak trend: flagged, current streak of growing epochs,
    last epoch-over-epoch growth (bytes)."""

    flagged: bool
    streak: int
    last_growth: int


@dataclass(frozen=True)
class OomRetryResult:
    """What :meth:`Tracker.run_oom_retry` did: the OOM retry's result (not
    an OOM report, which is :meth:`Tracker.set_oom_report`'s and
    :class:`OomReportStatus`'s). ``OomReport``, its old name, still works
    with a DeprecationWarning until 0.3.0."""

    succeeded: bool
    retries: int
    freed_bytes: int
    #: Bytes freed per source.
    freed: Tuple[int, ...]
    #: The step's return value (None if it never succeeded).
    result: Any = None


@dataclass(frozen=True)
class OomCache:
    """A framework's cache on one device, given with an out-of-memory report
    (:meth:`Tracker.report_oom`): bytes it holds from the driver
    (``reserved``), bytes of them in use (``allocated``) and what releasing
    it would give back (``releasable``, by the framework's own account);
    None where unknown."""

    device: int
    reserved: Optional[int] = None
    allocated: Optional[int] = None
    releasable: Optional[int] = None


@dataclass(frozen=True)
class OomReportStatus:
    """Where a tracker's out-of-memory report stands
    (:meth:`Tracker.oom_status`)."""

    #: The next trigger writes a report.
    armed: bool
    #: Configured triggers.
    driver: bool
    caller: bool
    #: Reports written (one per arming).
    reports_written: int
    #: Triggers seen, written or not.
    triggers_seen: int
    #: Triggers since the last report, counted and not written.
    later_triggers: int
    #: ``Status.OK``, or the status of the last report's failed write.
    last_write_status: int


def _unbound(name: str) -> Callable[..., int]:
    """``name`` without declared argument types, as windows.py's reset: a
    step's boundary passes ctypes objects made once (handle, result array,
    count), which ctypes hands on as they are. A library without the symbol
    gets the declared function (its error names what is missing)."""
    try:
        f = _ffi.lib[name]
    except (AttributeError, KeyError):
        return getattr(C, name)  # type: ignore[no-any-return]
    f.restype = c_uint32
    return f


_END_INTO = _unbound("memprobe_tracker_end_into")
_END_TAIL = _unbound("memprobe_tracker_end_tail")
_RESUME = _unbound("memprobe_tracker_resume")


class _RawOut:
    """A tracker's result arrays for raw step boundaries (windows.py's
    layout), made at the first one."""

    __slots__ = ("outs", "count", "unpack")

    def __init__(self, n: int):
        self.outs: List[Tuple[bytearray, ctypes.c_void_p, Any]] = [_result_array(n)]
        self.count = ctypes.c_size_t(n)
        self.unpack: Callable[[Any], RawDeltas] = struct.Struct("=" + _DELTA_FORMAT * n).unpack_from


class _Phase:
    """The context manager of :meth:`Tracker.phase`; ``.record`` after exit."""

    def __init__(self, tracker: "Tracker", kind: Kind, name: Optional[str]):
        self._tracker, self._kind, self._name = tracker, kind, name
        self.record: Optional[PhaseRecord] = None

    def __enter__(self) -> "_Phase":
        self._tracker.begin(self._kind, self._name)
        return self

    def __exit__(self, *exc: object) -> None:
        self.record = self._tracker.end(self._kind, self._name)


def default_is_oom(exc: BaseException) -> bool:
    """fastai's test: MemoryError, torch's OutOfMemoryError, or a
    RuntimeError saying "out of memory"."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class Tracker(Owned):
    """Tracks a training loop's phases over ``sources``. Default: this
    process's RSS, plus the exact PyTorch allocator sources of every visible
    CUDA device (``torch_alloc:N``, ``torch_reserved:N``; see
    :mod:`memprobe.integrations.torch`) when PyTorch has initialised CUDA
    and ``torch_sources`` is true. Close it (or use ``with``) to finish its
    sinks. ``attribution=True`` (or an
    :class:`~memprobe.integrations.torch_attribution.AttributionOptions`)
    names the tensors live at each epoch's peak step (``self.attribution``;
    see :mod:`memprobe.integrations.torch_attribution`)."""

    _FREE = "memprobe_tracker_free"

    def __init__(
        self,
        sources: Union[Source, Iterable[Source], None] = None,
        *,
        torch_sources: bool = True,
        attribution: Any = None,
    ):
        if attribution is None:
            # allocator_sources(attribution=...) carries the request.
            attribution = getattr(sources, "attribution", None)
        self.attribution: Any = None
        if sources is None:
            # Default: RSS, plus PyTorch's allocator per device when CUDA is
            # initialised (exact GPU peaks; torch is never imported here).
            from .integrations.torch import default_sources

            sources = default_sources(torch_sources)
        self._sources: Tuple[Source, ...] = tuple(as_sources(sources))
        self._keep: List[Any] = []  # ctypes callbacks that must outlive the tracker
        self._errors: List[BaseException] = []
        self._flush = False
        self._closed = True
        arr, n = _ffi.handles(self._sources)
        h = _ffi.out_handle()
        check_over(C.memprobe_tracker_new(arr, n, byref(h)), self._sources)
        self._handle = h.value
        # The handle as ctypes passes it as is (an int becomes a new
        # c_void_p at every call): boundaries use it.
        self._arg = ctypes.c_void_p(h.value)
        self._delta_array = _ffi.memprobe_delta * len(self._sources)
        self._raw: Optional[_RawOut] = None
        self._closed = False
        if attribution is not None and attribution is not False:
            self._attribute(attribution)

    def _attribute(self, attribution: Any) -> None:
        """Which tensors made each epoch's peak: an observer of this
        tracker's steps and epochs (:mod:`memprobe.integrations.torch_attribution`)."""
        from .integrations.torch_attribution import Attribution, as_options

        options = as_options(attribution)
        if options is None:
            return
        att = Attribution(options, self._sources)
        if not att.active:
            return
        self.attribution = att

        # A sink of its own, not add_callback_sink's: it runs at every step,
        # and reads the library's record as it is (no PhaseRecord, no Delta).
        def on_record(rec_p: Any, deltas_p: Any, _n: int, _ud: Any) -> None:
            try:
                att.on_record(rec_p.contents, deltas_p)
            except BaseException as e:  # noqa: BLE001 - cannot cross the library
                self._errors.append(e)

        cb = _ffi.memprobe_record_fn(on_record)
        check(C.memprobe_tracker_add_callback_sink(self._handle, cb, None))
        self._keep.append(cb)

    @property
    def sources(self) -> Tuple[Source, ...]:
        return self._sources

    # --- phases ----------------------------------------------------------------

    def begin(self, kind: Kind, name: Optional[str] = None) -> None:
        """Begins a phase: ``"step"``, ``"epoch"``, ``"experience"``,
        ``"stream"``, a :class:`PhaseKind`, or any other string for a custom
        phase. Steps nest in epochs, epochs in experiences, experiences in
        streams (else :class:`~memprobe.WrongOrderError`); custom phases
        nest anywhere."""
        k, n = _kind(kind, name)
        check_over(C.memprobe_tracker_begin(self._handle, k, n), self._sources)

    def _begin_code(self, k: int, n: Optional[bytes]) -> None:
        """:meth:`begin` with the kind and name as the C call takes them."""
        status = C.memprobe_tracker_begin(self._arg, k, n)
        if status:
            check_over(status, self._sources)

    def _ending(self, fn: Callable[..., int], kind: Kind, name: Optional[str]) -> PhaseRecord:
        k, n = _kind(kind, name)
        rec = _ffi.memprobe_phase_record()
        deltas = self._delta_array()
        if self._flush:
            sys.stdout.flush()
            sys.stderr.flush()
        status = fn(self._arg, k, n, byref(rec), deltas, len(deltas))
        if status:
            check_over(status, self._sources)
        return PhaseRecord._from_c(rec, deltas)

    def end(self, kind: Kind, name: Optional[str] = None) -> PhaseRecord:
        """Ends the innermost phase, which must be ``kind`` (and ``name``)."""
        return self._ending(C.memprobe_tracker_end, kind, name)

    def next(self, kind: Kind, name: Optional[str] = None) -> PhaseRecord:
        """Ends the innermost phase and begins the next of the same kind at
        the same instant (the cheapest step boundary)."""
        return self._ending(C.memprobe_tracker_next, kind, name)

    # --- tails: one boundary per step ------------------------------------------

    def end_into(
        self, kind: Kind, name: Optional[str] = None, next_kind: Optional[Kind] = None, next_name: Optional[str] = None
    ) -> PhaseRecord:
        """Ends the innermost phase, as :meth:`end`, and keeps its window
        running, restarted at this end, as the *tail* of the phase
        ``next_kind`` / ``next_name`` (default: the same phase): the next
        :meth:`resume` of that phase begins at this end. One boundary per
        step when the hook ending a step cannot tell whether another
        follows; a release due at this end runs in the tail."""
        return self._ending_into(kind, name, next_kind, next_name)

    def _ending_into(
        self, kind: Kind, name: Optional[str], next_kind: Optional[Kind], next_name: Optional[str]
    ) -> PhaseRecord:
        k, n = _kind(kind, name)
        nk, nn = (k, n) if next_kind is None else _kind(next_kind, next_name)
        rec = _ffi.memprobe_phase_record()
        deltas = self._delta_array()
        if self._flush:
            sys.stdout.flush()
            sys.stderr.flush()
        status = C.memprobe_tracker_end_into(self._arg, k, n, nk, nn, byref(rec), deltas, len(deltas))
        if status:
            check_over(status, self._sources)
        return PhaseRecord._from_c(rec, deltas)

    def end_into_raw(
        self, kind: Kind, name: Optional[str] = None, next_kind: Optional[Kind] = None, next_name: Optional[str] = None
    ) -> RawDeltas:
        """:meth:`end_into`, the ended phase's deltas as the boundary read
        them (:data:`memprobe.windows.RawDeltas`: no record or ``Delta``
        built; a training step's hot path)."""
        k, n = _kind(kind, name)
        nk, nn = (k, n) if next_kind is None else _kind(next_kind, next_name)
        return self._end_into_raw(k, n, nk, nn)

    def end_tail_raw(
        self, kind: Kind, name: Optional[str] = None, next_kind: Optional[Kind] = None, next_name: Optional[str] = None
    ) -> RawDeltas:
        """Ends the phase that began on its own tail and ends now:
        :meth:`resume` then :meth:`end_into_raw` in one call (one boundary
        per step for a loop whose hooks see only the end of each step)."""
        k, n = _kind(kind, name)
        nk, nn = (k, n) if next_kind is None else _kind(next_kind, next_name)
        return self._end_into_raw(k, n, nk, nn, _END_TAIL)

    def _end_into_raw(
        self, k: int, n: Optional[bytes], nk: int, nn: Optional[bytes], fn: Optional[Callable[..., int]] = None
    ) -> RawDeltas:
        """:meth:`end_into_raw` (or, with ``fn=_END_TAIL``,
        :meth:`end_tail_raw`) with the kinds and names as the C call takes
        them (an integration's hot path resolves them once)."""
        raw = self._raw
        if raw is None:
            raw = self._raw = _RawOut(len(self._sources))
        try:
            out = raw.outs.pop()
        except IndexError:  # another thread's boundary holds the array
            out = _result_array(len(self._sources))
        if self._flush:
            sys.stdout.flush()
            sys.stderr.flush()
        status = (fn or _END_INTO)(self._arg, k, n, nk, nn, None, out[1], raw.count)
        if status:
            raw.outs.append(out)
            check_over(status, self._sources)
        values = raw.unpack(out[0])
        raw.outs.append(out)
        return values

    def resume(
        self, kind: Kind, name: Optional[str] = None, from_kind: Optional[Kind] = None, from_name: Optional[str] = None
    ) -> None:
        """Begins a phase on the tail of ``from_kind`` / ``from_name``
        (default: its own), made by :meth:`end_into` or :meth:`mark_tail`:
        its interval began when the tail did. Without such a tail, as
        :meth:`begin`."""
        k, n = _kind(kind, name)
        fk, fn = (k, n) if from_kind is None else _kind(from_kind, from_name)
        self._resume(k, n, fk, fn)

    def _resume(self, k: int, n: Optional[bytes], fk: int, fn: Optional[bytes]) -> None:
        """:meth:`resume` with the kinds and names as the C call takes them."""
        status = _RESUME(self._arg, k, n, fk, fn)
        if status:
            check_over(status, self._sources)

    def mark_tail(self, kind: Kind, name: Optional[str] = None) -> None:
        """Starts the tail of ``kind`` (and ``name``) now: the next
        :meth:`resume` of it begins here (no phase begins or ends)."""
        k, n = _kind(kind, name)
        check_over(C.memprobe_tracker_mark_tail(self._arg, k, n), self._sources)

    def phase(self, kind: Kind, name: Optional[str] = None) -> _Phase:
        """``with tracker.phase("eval") as p: ...``; ``p.record`` afterwards."""
        return _Phase(self, kind, name)

    def step(self) -> _Phase:
        return _Phase(self, PhaseKind.STEP, None)

    def epoch(self) -> _Phase:
        return _Phase(self, PhaseKind.EPOCH, None)

    def experience(self) -> _Phase:
        return _Phase(self, PhaseKind.EXPERIENCE, None)

    def stream(self) -> _Phase:
        return _Phase(self, PhaseKind.STREAM, None)

    # --- sinks -------------------------------------------------------------------

    def add_table_sink(self, kind: Kind = PhaseKind.EPOCH, fd: Optional[int] = None) -> None:
        """fastai's PeakMemMetric table: one row per ended phase of ``kind``,
        each source's delta used and delta peaked in MiB, written by the
        library to file descriptor ``fd`` (default: standard output; Python's
        buffers are flushed before each phase ends)."""
        k, custom = _kind(kind, None)
        if custom is not None:
            raise ValueError(f"a table sink takes a phase kind, not {kind!r}")
        if fd is None:
            try:
                fd = sys.stdout.fileno()
            except (AttributeError, OSError, ValueError):  # a replaced sys.stdout
                fd = 1
        self._flush = True
        check(C.memprobe_tracker_add_table_sink(self._handle, k, int(fd)))

    def add_jsonl_sink(self, path: str) -> None:
        """One JSON object per record, written to a temporary file beside
        ``path`` and renamed into place when the sinks finish."""
        check(C.memprobe_tracker_add_jsonl_sink(self._handle, str(path).encode()))

    def add_csv_sink(self, path: str) -> None:
        """One CSV row per record and source (header first), written like
        the JSON Lines sink."""
        check(C.memprobe_tracker_add_csv_sink(self._handle, str(path).encode()))

    def add_callback_sink(self, fn: Callable[[PhaseRecord], None]) -> None:
        """Calls ``fn(record)`` for each ended phase, on the thread that ended
        it. Exceptions are kept in :attr:`callback_errors` (they cannot
        propagate through the library)."""

        def on_record(rec_p: Any, deltas_p: Any, n: int, _ud: Any) -> None:
            try:
                fn(PhaseRecord._from_c(rec_p.contents, [deltas_p[i] for i in range(n)]))
            except BaseException as e:  # noqa: BLE001
                self._errors.append(e)

        cb = _ffi.memprobe_record_fn(on_record)
        check(C.memprobe_tracker_add_callback_sink(self._handle, cb, None))
        self._keep.append(cb)

    def finish_sinks(self) -> None:
        """Finishes every sink now (files renamed into place) and detaches them."""
        check(C.memprobe_tracker_finish_sinks(self._handle))

    @property
    def callback_errors(self) -> List[BaseException]:
        """Exceptions raised by callback sinks and release callbacks."""
        return self._errors

    # --- cache release -------------------------------------------------------

    def add_release(self, fn: Callable[[], Any], name: Optional[str] = None, *, gc: bool = False) -> None:
        """Registers a release callback (``gc=True``: a garbage collector, run
        only when a policy asks for GC and on out-of-memory recovery). An
        exception fails that release (recorded; other callbacks still run)."""
        label: str = name or getattr(fn, "__name__", None) or "release"

        def c_release(_ud: Any) -> int:
            try:
                fn()
                return 0
            except BaseException as e:  # noqa: BLE001
                self._errors.append(e)
                return 1

        cb = _ffi.memprobe_release_fn(c_release)
        kind = _ffi.MEMPROBE_RELEASE_GC if gc else _ffi.MEMPROBE_RELEASE_CACHE
        check(C.memprobe_tracker_add_release(self._handle, label.encode(), kind, cb, None))
        self._keep.append(cb)

    def add_gc_release(self) -> None:
        """Registers Python's ``gc.collect`` as the garbage-collector release."""
        import gc as _gc

        self.add_release(_gc.collect, "gc.collect", gc=True)

    def release_every(self, kind: Kind, n: int, *, gc: bool = False) -> None:
        """Runs the release callbacks at the end of every ``n``-th step or
        epoch, like ClearCacheHook (``gc``: the GC ones too)."""
        k, _ = _kind(kind, None)
        check(C.memprobe_tracker_release_every(self._handle, k, int(n), bool(gc)))

    def release_below_free(self, source_index: int, nbytes: int, *, gc: bool = False) -> None:
        """Runs the release callbacks at the end of any step or epoch where
        source ``source_index``'s free bytes are below ``nbytes``."""
        check(C.memprobe_tracker_release_below_free(self._handle, int(source_index), int(nbytes), bool(gc)))

    def release_now(self, *, gc: bool = False) -> List[int]:
        """Runs the release callbacks now; returns the bytes freed per source."""
        n = len(self._sources)
        freed = (c_uint64 * n)()
        check_over(C.memprobe_tracker_release_now(self._handle, bool(gc), freed, n), self._sources)
        return [int(x) for x in freed]

    @property
    def releases_fired(self) -> int:
        """Releases fired so far (every reason)."""
        out = c_uint64()
        check(C.memprobe_tracker_releases_fired(self._handle, byref(out)))
        return int(out.value)

    # --- leaks and out-of-memory ---------------------------------------------

    def set_leak_policy(self, threshold_bytes: int, epochs: int) -> None:
        """Flags a source whose end-of-epoch used grows by more than
        ``threshold_bytes`` for ``epochs`` epochs in a row (0 turns it off)."""
        check(C.memprobe_tracker_set_leak_policy(self._handle, int(threshold_bytes), int(epochs)))

    def leak_status(self, index: int = 0) -> LeakStatus:
        flagged, streak, growth = c_bool(), c_uint32(), c_int64()
        check(
            C.memprobe_tracker_leak_status(
                self._handle, int(index), byref(flagged), byref(streak), byref(growth)
            )
        )
        return LeakStatus(bool(flagged.value), int(streak.value), int(growth.value))

    def run_oom_retry(
        self,
        step: Callable[[], Any],
        max_retries: int = 3,
        *,
        is_oom: Callable[[BaseException], bool] = default_is_oom,
    ) -> OomRetryResult:
        """fastai's gpu_mem_restore, outside IPython: runs ``step()``; when it
        raises an out-of-memory error (``is_oom``), runs every release
        callback (GC included) and retries, at most ``max_retries`` times.
        Another exception propagates. When the step still runs out of
        memory after every retry, the result says so (``succeeded`` False)
        instead of raising, and an out-of-memory report configured for the
        caller trigger (``set_oom_report``) is written. The step must not
        use this tracker (it runs inside the library's call)."""
        state: Dict[str, Any] = {}

        def c_step(_ud: Any) -> int:
            try:
                state["result"] = step()
                return _ffi.MEMPROBE_STEP_DONE
            except BaseException as e:  # noqa: BLE001
                if is_oom(e):
                    state["oom"] = e
                    return _ffi.MEMPROBE_STEP_OUT_OF_MEMORY
                state["error"] = e
                return 2

        cb = _ffi.memprobe_step_fn(c_step)
        out = _ffi.memprobe_oom_retry_result()
        n = len(self._sources)
        freed = (c_uint64 * n)()
        status = C.memprobe_tracker_run_oom_retry(
            self._handle, cb, None, int(max_retries), byref(out), freed, n
        )
        if "error" in state:
            raise state["error"]
        # OUT_OF_MEMORY: every retry ran out of memory; the result says so.
        if status != Status.OUT_OF_MEMORY:
            check_over(status, self._sources)
        return OomRetryResult(
            succeeded=bool(out.succeeded),
            retries=int(out.retries),
            freed_bytes=int(out.freed_bytes),
            freed=tuple(int(x) for x in freed),
            result=state.get("result"),
        )

    # --- out-of-memory reports ------------------------------------------------

    def set_oom_report(
        self,
        path: Union[str, "os.PathLike[str]", None] = None,
        *,
        fd: Optional[int] = None,
        summary_fd: Optional[int] = None,
        callback: Optional[Callable[[str, str], None]] = None,
        keep_ended: int = _ffi.MEMPROBE_OOM_KEEP_ENDED_DEFAULT,
        driver: bool = False,
        caller: bool = True,
    ) -> None:
        """Configures the out-of-memory report (docs/oom.md): when an
        allocation fails for lack of GPU memory, ONE report — the failed
        allocation, the open phases with each source's peak so far, the
        last ``keep_ended`` ended phases, each GPU's per-process use, what
        releasing caches would free — as JSON written to ``path`` (whole, or
        not at all) and/or descriptor ``fd``, as a summary for people to
        ``summary_fd`` (e.g. 2, standard error), and/or to
        ``callback(json, summary)`` (exceptions land in
        :attr:`callback_errors`). Triggers: ``caller`` (:meth:`report_oom`;
        :func:`memprobe.integrations.torch.report_oom` calls it from
        PyTorch's out-of-memory observer) and ``driver`` (memprobe's
        interposer sees the driver fail an allocation: needs
        ``libmemprobe_interpose.so`` loaded, else
        :class:`~memprobe.UnavailableError`). The first trigger writes; later
        ones are counted (:meth:`oom_status`), and settled into the file when
        re-armed, cleared or closed. Configuring twice is a
        :class:`~memprobe.WrongOrderError` (clear it first)."""
        o = _ffi.memprobe_oom_report_options()
        o.struct_size = ctypes.sizeof(o)
        o.triggers = (_ffi.MEMPROBE_OOM_TRIGGER_DRIVER if driver else 0) | (
            _ffi.MEMPROBE_OOM_TRIGGER_CALLER if caller else 0
        )
        o.path = os.fsencode(path) if path is not None else None
        o.json_fd = -1 if fd is None else int(fd)
        o.summary_fd = -1 if summary_fd is None else int(summary_fd)
        o.keep_ended = int(keep_ended)
        cb = None
        if callback is not None:
            user = callback

            def on_report(json_p: bytes, summary_p: bytes, _ud: Any) -> None:
                try:
                    user(json_p.decode("utf-8", "replace"), summary_p.decode("utf-8", "replace"))
                except BaseException as e:  # noqa: BLE001 - cannot cross the library
                    self._errors.append(e)

            cb = _ffi.memprobe_oom_report_fn(on_report)
            o.callback = cb
        check(C.memprobe_tracker_set_oom_report(self._handle, byref(o)))
        if cb is not None:
            self._keep.append(cb)  # called until the tracker is freed

    def clear_oom_report(self) -> None:
        """Removes the out-of-memory report (a no-op when none is set);
        triggers counted since its last report are settled into its file."""
        check(C.memprobe_tracker_set_oom_report(self._handle, None))

    def report_oom(
        self,
        device: int = _ffi.MEMPROBE_OOM_DEVICE_UNKNOWN,
        requested_bytes: int = 0,
        detail: Optional[str] = None,
        *,
        reported_by: Optional[str] = None,
        device_total: Optional[int] = None,
        device_free: Optional[int] = None,
        caches: Iterable[OomCache] = (),
        live_blocks_json: Optional[str] = None,
    ) -> None:
        """Reports an allocation that failed for lack of memory (the caller's
        trigger): on ``device`` (-1: unknown), asking ``requested_bytes`` (0:
        unknown), with ``detail`` (an exception's message). ``reported_by``
        names the framework (default ``"caller"``), ``device_total`` /
        ``device_free`` are the device's figures as it saw them, ``caches``
        its caches per device, ``live_blocks_json`` what it had live (one
        ``memprobe.torch_attribution/1`` record of kind ``oom`` as JSON,
        embedded as the report's ``live_blocks``; one that is not valid
        JSON, has another schema or is over 256 KiB is left out, the
        report's ``live_blocks_error`` saying why). The first report after
        configuration (or re-arming) is written, with the open phases
        measured now; later ones are counted. :class:`~memprobe.WrongOrderError` when no report is
        configured for the caller's trigger."""
        caches = list(caches)
        text = detail.encode("utf-8", "replace") if detail is not None else None
        plain = reported_by is None and device_total is None and device_free is None
        if plain and not caches and live_blocks_json is None:
            check(C.memprobe_tracker_report_oom(self._handle, int(device), int(requested_bytes), text))
            return
        e = _ffi.memprobe_oom_report_event()
        e.struct_size = ctypes.sizeof(e)
        e.device = int(device)
        e.requested_bytes = int(requested_bytes)
        e.reported_by = reported_by.encode() if reported_by is not None else None
        e.detail = text
        # "surrogatepass": a lone surrogate reaches the library, which says
        # the record is not UTF-8, rather than failing here.
        if live_blocks_json is not None:
            e.live_blocks_json = live_blocks_json.encode("utf-8", "surrogatepass")
        valid = 0
        if device_total is not None:
            valid |= _ffi.MEMPROBE_OOM_EVENT_DEVICE_TOTAL
            e.device_total_bytes = int(device_total)
        if device_free is not None:
            valid |= _ffi.MEMPROBE_OOM_EVENT_DEVICE_FREE
            e.device_free_bytes = int(device_free)
        e.valid = valid
        arr = (_ffi.memprobe_oom_report_cache * max(len(caches), 1))()
        for i, c in enumerate(caches):
            bits = 0
            for bit, value, field_name in (
                (_ffi.MEMPROBE_OOM_CACHE_RESERVED, c.reserved, "reserved_bytes"),
                (_ffi.MEMPROBE_OOM_CACHE_ALLOCATED, c.allocated, "allocated_bytes"),
                (_ffi.MEMPROBE_OOM_CACHE_RELEASABLE, c.releasable, "releasable_bytes"),
            ):
                if value is not None:
                    bits |= bit
                    setattr(arr[i], field_name, max(int(value), 0))
            arr[i].device = int(c.device)
            arr[i].valid = bits
        e.n_caches = len(caches)
        e.caches = arr if caches else None
        check(C.memprobe_tracker_report_oom_event(self._handle, byref(e)))

    def oom_status(self) -> OomReportStatus:
        """Where the out-of-memory report stands;
        :class:`~memprobe.WrongOrderError` when none is configured."""
        st = _ffi.memprobe_oom_report_status()
        check(C.memprobe_tracker_oom_status(self._handle, byref(st)))
        try:
            last: int = Status(st.last_write_status)
        except ValueError:
            last = int(st.last_write_status)
        return OomReportStatus(
            armed=bool(st.armed),
            driver=bool(st.triggers & _ffi.MEMPROBE_OOM_TRIGGER_DRIVER),
            caller=bool(st.triggers & _ffi.MEMPROBE_OOM_TRIGGER_CALLER),
            reports_written=int(st.reports_written),
            triggers_seen=int(st.triggers_seen),
            later_triggers=int(st.later_triggers),
            last_write_status=last,
        )

    def rearm_oom_report(self) -> None:
        """Arms the out-of-memory report again: the next trigger writes a new
        report (replacing the file)."""
        check(C.memprobe_tracker_rearm_oom_report(self._handle))

    # --- lifetime ------------------------------------------------------------

    def close(self) -> None:
        """Releases the tracker (idempotent); attribution writes what it
        still holds and turns torch's history off."""
        att = self.attribution
        if att is not None and not self._closed:
            att.close()
        super().close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<memprobe.Tracker {state} over {len(self._sources)} source(s)>"


def __getattr__(name: str) -> Any:
    return _deprecated.old_name(__name__, name, globals())


__all__ = [
    "LeakStatus",
    "OomCache",
    "OomReportStatus",
    "OomRetryResult",
    "PhaseKind",
    "PhaseRecord",
    "Tracker",
    "default_is_oom",
]
