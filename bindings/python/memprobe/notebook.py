"""Notebooks: one line of exact memory deltas after every cell.

In IPython or a Jupyter notebook::

    %load_ext memprobe

Every cell run after that prints one line (ipyexperiments' ``CellLogger``
header and rows, on one line; fastai's deltas, in MiB as fastai's ``b2mb``
rounds them)::

    ･ RAM: △Consumed △Peaked Used Total | CPU:      0    256    312 MB | GPU:      0      0      0 MB | Exec time 0.412s

- ``CPU``: this process's RSS (``Source.process()``; the peak is the
  kernel's high-water mark, reset when the cell starts: exact).
- ``GPU``: bytes PyTorch's caching allocator gives to tensors
  (``torch_alloc:N``, exact: see :mod:`memprobe.integrations.torch`), once
  PyTorch has initialised CUDA (memprobe never initialises it); ``GPU<N>``
  per device when several are visible. Without CUDA the columns read
  ``0 0 0``, fastai's ``GPUMemory(0, 0, 0)`` convention. The cell in which
  CUDA gets initialised reads torch's own counters since initialisation
  (``memory_allocated`` / ``max_memory_allocated``); later cells measure
  the allocator sources over the cell.
- ``△Consumed``: used at the end minus used at the start (fastai's delta
  used); ``△Peaked``: how far the cell went above that (fastai's delta
  peaked: the peak minus the used at the start, minus the growth when it
  grew); ``Used Total``: used at the end. A cell that allocates 256 MiB
  and frees it reads ``0 256``.

Each cell is a custom phase ``cell`` of a :class:`memprobe.Tracker`,
begun when the cell starts (IPython's ``pre_run_cell``) and ended when it
ends (``post_run_cell``): the cell's own work, nothing between cells. Under
``memprobe run`` (``memprobe run -- ipython script.ipy``) every cell is in
the run's summary, JSON and chart. The hook costs under a tenth of a millisecond for an ordinary cell;
after a cell that freed tens of MiB, about a millisecond, the kernel
finishing that free (docs/bindings-benchmarks.md).

``current().set_oom_report("oom.json")``: when a CUDA allocation fails in
a cell, an out-of-memory report names that cell, its peaks so far and the
cells before it (:func:`memprobe.integrations.torch.report_oom`).
``current().set_attribution(True)``: which tensors made each cell's GPU
peak, a table per cell (:mod:`memprobe.integrations.torch_attribution`).

``%%memprobe`` at the top of a cell measures that cell alone and prints a
table, one row per source (RSS, and each allocator source:
``torch_alloc:N``, ``torch_reserved:N``), whether the per-cell line is on
or not. ``%memprobe off`` stops the per-cell line, ``%memprobe on`` starts
it again, ``%memprobe`` says which; ``%unload_ext memprobe`` removes the
extension. :func:`current` gives the extension of the running shell, whose
``history`` keeps every measured cell (:class:`CellRecord`, bytes).

This replaces ipyexperiments' ``IPyExperimentsCPU/GPU`` cell logger and
fastai's per-cell ``GPUMemTrace``, whose peaks come from a polling thread.
"""

from __future__ import annotations

import ast
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, TextIO, Tuple

from .errors import MemprobeError
from .sources import Fidelity, Source, SourceKind
from .units import b2mb
from .tracker import PhaseKind, Tracker
from .windows import Delta

#: The line's header: ipyexperiments' column names.
HEADER = "･ RAM: △Consumed △Peaked Used Total"
_ALLOC = "torch_alloc:"


@dataclass(frozen=True)
class CellRecord:
    """What one cell did: its execution count (None when IPython gave
    none), its wall time in seconds, and one :class:`~memprobe.Delta` per
    source name (``rss``, ``torch_alloc:0``, ``torch_reserved:0``, ...),
    in bytes."""

    number: Optional[int]
    seconds: float
    deltas: Dict[str, Delta]

    @property
    def cpu(self) -> Delta:
        """This process's RSS over the cell."""
        return self.deltas["rss"]

    def gpus(self) -> List[Tuple[int, Delta]]:
        """``(device, torch_alloc delta)`` per device measured, by device."""
        out = [(int(name[len(_ALLOC):]), d) for name, d in self.deltas.items() if name.startswith(_ALLOC)]
        return sorted(out, key=lambda p: p[0])


def _cols(d: Optional[Delta]) -> str:
    if d is None:  # no GPU: fastai's GPUMemory(0, 0, 0)
        return f"{0:6,} {0:6,} {0:6,} MB"
    return f"{b2mb(d.delta_used):6,} {b2mb(d.delta_peaked):6,} {b2mb(d.used_end):6,} MB"


def format_line(record: CellRecord) -> str:
    """The per-cell line (see the module's documentation)."""
    parts = [HEADER, f"CPU: {_cols(record.cpu)}"]
    gpus = record.gpus()
    if not gpus:
        parts.append(f"GPU: {_cols(None)}")
    elif len(gpus) == 1:
        parts.append(f"GPU: {_cols(gpus[0][1])}")
    else:
        parts.extend(f"GPU{n}: {_cols(d)}" for n, d in gpus)
    parts.append(f"Exec time {record.seconds:.3f}s")
    return " | ".join(parts)


def format_table(record: CellRecord) -> str:
    """``%%memprobe``'s table: one row per source, MiB (``b2mb``)."""
    where = "this cell" if record.number is None else f"cell {record.number}"
    rows = [
        f"･ memprobe: {where} | Exec time {record.seconds:.3f}s",
        f"  {'source':<18} {'△Consumed':>10} {'△Peaked':>10} {'Used Total':>10} {'Peak':>10}  fidelity",
    ]
    for name, d in record.deltas.items():
        fid = d.fidelity.name.lower() if isinstance(d.fidelity, Fidelity) else str(d.fidelity)
        rows.append(
            f"  {name:<18} {b2mb(d.delta_used):10,} {b2mb(d.delta_peaked):10,} "
            f"{b2mb(d.used_end):10,} {b2mb(d.peak):10,}  {fid}"
        )
    if not record.gpus():
        rows.append(f"  {'GPU (no CUDA)':<18} {0:10,} {0:10,} {0:10,} {0:10,}  -")
    rows.append("  (MB: MiB, rounded toward zero as fastai's b2mb)")
    return "\n".join(rows)


#: The tracker's phase of a cell (under ``memprobe run``: ``cell N``).
CELL = "cell"


class _Measured:
    """The sources a cell is measured over: this process's RSS, plus the
    allocator sources of every visible device once PyTorch has initialised
    CUDA; one :class:`memprobe.Tracker` over them, each cell a custom phase
    ``cell`` of it (so ``memprobe run`` and the tracker's other observers
    see every cell)."""

    def __init__(self, torch_sources: bool, oom_report: Any = None, attribution: Any = None):
        self.torch_sources = torch_sources
        self.oom_report = oom_report
        self.attribution = attribution
        self.rss: Optional[Source] = Source.process()
        self.gpu: Optional[List[Source]] = None  # an AllocatorSources
        self.tracker: Optional[Tracker] = None
        self.gpu_error: Optional[str] = None
        # Bound once: an import statement in the per-cell check cost a cold
        # cell (after one that touched tens of MiB) ~10 µs.
        self._cuda_initialized: Optional[Callable[[], bool]] = None
        if torch_sources:
            from .integrations.torch import cuda_initialized

            self._cuda_initialized = cuda_initialized
        self._attach_gpu()
        self._open_tracker()

    def sources(self) -> List[Source]:
        assert self.rss is not None
        return [self.rss] + list(self.gpu or [])

    def wants_gpu(self) -> bool:
        """Whether CUDA has been initialised since the sources were made."""
        if self._cuda_initialized is None or self.gpu is not None or self.gpu_error is not None:
            return False
        return self._cuda_initialized()

    def _attach_gpu(self) -> bool:
        if not self.wants_gpu():
            return False
        from .integrations.torch import allocator_sources

        try:
            self.gpu = allocator_sources()
        except (MemprobeError, RuntimeError, ValueError) as e:
            self.gpu_error = f"{type(e).__name__}: {e}"
            return False
        return True

    def attach_gpu(self) -> bool:
        """Adds the allocator sources (CUDA was initialised since), with a
        new tracker over every source."""
        if not self._attach_gpu():
            return False
        if self.tracker is not None:
            self.tracker.close()
        self._open_tracker()
        return True

    def _open_tracker(self) -> None:
        sources = self.sources()
        # Attribution needs the allocator sources: asked before CUDA is
        # initialised, it starts with the tracker that has them.
        wanted = self.attribution if self.gpu is not None else None
        self.tracker = Tracker(sources, attribution=wanted)
        if self.tracker.attribution is not None:
            # A table per cell: the cell is the step and the epoch.
            self.tracker.attribution.cell_phase = CELL
            self.tracker.attribution.stage = CELL
        self._names = [s.name for s in sources]
        if self.oom_report is not None:
            self.report_oom(self.oom_report)

    def set_attribution(self, attribution: Any) -> None:
        """Turns attribution on (or off: None) with a new tracker."""
        self.attribution = attribution
        if self.tracker is not None:
            self.tracker.close()
        self._open_tracker()

    def report_oom(self, oom_report: Any) -> None:
        """Configures the tracker's out-of-memory report (and that of every
        tracker made later, when the GPU sources come)."""
        from .integrations.torch import report_oom

        self.oom_report = oom_report
        assert self.tracker is not None
        kwargs = dict(oom_report) if isinstance(oom_report, dict) else {"path": oom_report}
        report_oom(self.tracker, **kwargs)

    def begin(self) -> None:
        """The cell begins."""
        assert self.tracker is not None
        self.tracker.begin(PhaseKind.CUSTOM, CELL)

    def end(self) -> List[Delta]:
        """The cell ends: each source's delta over it."""
        assert self.tracker is not None
        return list(self.tracker.end(PhaseKind.CUSTOM, CELL).deltas)

    def names(self) -> List[str]:
        """The source names, in order (made with the tracker)."""
        return self._names

    def since_cuda_init(self) -> Dict[str, Delta]:
        """The GPU part of the cell in which CUDA was initialised (see
        :func:`_since_cuda_init`); empty, the reason kept, when torch
        cannot say."""
        try:
            return _since_cuda_init()
        except Exception as e:  # noqa: BLE001 - a torch whose CUDA cannot be read: no GPU columns
            self.gpu_error = f"{type(e).__name__}: {e}"
            return {}

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
        close = getattr(self.gpu, "close", None)
        if close is not None:
            close()  # the list's since-start window; the shared sources go when unheld
        self.gpu = None
        if self.rss is not None:
            self.rss.close()
            self.rss = None


def _since_cuda_init() -> Dict[str, Delta]:
    """The cell in which CUDA was initialised: torch's own counters since
    initialisation (the allocator held nothing before), per device."""
    import torch

    cuda = torch.cuda
    out: Dict[str, Delta] = {}
    for dev in range(int(cuda.device_count())):
        for prefix, now, peak in (
            (_ALLOC, cuda.memory_allocated, cuda.max_memory_allocated),
            ("torch_reserved:", cuda.memory_reserved, cuda.max_memory_reserved),
        ):
            end, top = int(now(dev)), int(peak(dev))
            top = max(top, end)
            out[f"{prefix}{dev}"] = Delta(
                used_start=0,
                used_end=end,
                peak=top,
                delta_used=end,
                # fastai's delta peaked from a start of 0: the peak above
                # what is held at the end.
                delta_peaked=top - end,
                kind=SourceKind.CUSTOM,
                fidelity=Fidelity.EXACT,
            )
    return out


class NotebookMemory:
    """The extension in one IPython shell: the per-cell hook (:meth:`on`,
    :meth:`off`), the ``%memprobe`` / ``%%memprobe`` magic, and the
    ``history`` of measured cells. Made by ``%load_ext memprobe``.

    ``torch_sources``: measure PyTorch's allocator once CUDA is initialised
    (default). ``file``: where lines and tables go (default: ``sys.stdout``
    at the time, which a Jupyter kernel sends to the cell's output)."""

    def __init__(
        self,
        shell: Any,
        *,
        torch_sources: bool = True,
        file: Optional[TextIO] = None,
        oom_report: Any = None,
        attribution: Any = None,
    ):
        self.shell = shell
        self.torch_sources = torch_sources
        self.file = file
        #: :func:`memprobe.integrations.torch.report_oom`'s ``path`` (or a
        #: dict of its keyword arguments): see :meth:`set_oom_report`.
        self.oom_report = oom_report
        #: Which tensors made each cell's peak (see :meth:`set_attribution`).
        self.attribution_options = attribution
        self.history: List[CellRecord] = []
        #: Nanoseconds the hook itself took for the last cell measured
        #: (``pre_run_cell`` plus ``post_run_cell``, printing included).
        self.last_cost_ns = 0
        self._measured: Optional[_Measured] = None
        self._armed = False
        self._t0 = 0.0
        self._pre_ns = 0
        self._gpu_at_start = False
        self._magic_registered = False

    # --- the per-cell hook -------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self._measured is not None

    def on(self) -> None:
        """Starts printing a line after every cell (from the next cell on)."""
        if self._measured is not None:
            return
        self._measured = _Measured(self.torch_sources, self.oom_report, self.attribution_options)
        self._armed = False
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)

    def off(self) -> None:
        """Stops the per-cell line (the magic stays)."""
        if self._measured is None:
            return
        for event, fn in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            try:
                self.shell.events.unregister(event, fn)
            except ValueError:
                pass
        self._measured.close()
        self._measured = None
        self._armed = False

    def set_oom_report(self, oom_report: Any) -> None:
        """When a CUDA allocation fails in a cell, writes an out-of-memory
        report (``oom_report``: its path, or a dict of
        :func:`memprobe.integrations.torch.report_oom`'s keyword arguments)
        naming the cell that was running, its peaks so far and the cells
        before it."""
        self.oom_report = oom_report
        if self._measured is not None:
            self._measured.report_oom(oom_report)

    def set_attribution(self, attribution: Any = True) -> None:
        """Names the tensors live at each cell's GPU peak (a table per cell,
        written as :mod:`memprobe.integrations.torch_attribution` says;
        ``attribution``: True, an ``AttributionOptions``, or None to stop),
        from the next cell on, once PyTorch has initialised CUDA."""
        self.attribution_options = attribution
        if self._measured is not None:
            self._measured.set_attribution(attribution)

    @property
    def attribution(self) -> Any:
        """The tracker's ``Attribution`` (None when off):
        ``attribution.epochs[N]`` is the N-th cell measured with it."""
        t = self.tracker
        return getattr(t, "attribution", None) if t is not None else None

    @property
    def tracker(self) -> Any:
        """The :class:`memprobe.Tracker` whose custom phase ``cell`` each
        measured cell is (None while the per-cell line is off)."""
        return self._measured.tracker if self._measured is not None else None

    def pre_run_cell(self, info: Any = None) -> None:
        start = time.perf_counter_ns()
        m = self._measured
        if m is None:
            return
        try:
            if m.wants_gpu():  # CUDA initialised between cells
                m.attach_gpu()
            self._gpu_at_start = m.gpu is not None
            m.begin()
        except MemprobeError as e:
            self._armed = False
            self._say(f"･ memprobe: cannot measure this cell: {e}")
            return
        self._armed = True
        now = time.perf_counter_ns()
        self._pre_ns = now - start
        self._t0 = now / 1e9

    def post_run_cell(self, result: Any = None) -> None:
        t1 = time.perf_counter_ns()
        m = self._measured
        if m is None or not self._armed:
            return  # the cell that loaded the extension (or turned it on)
        self._armed = False
        try:
            deltas = dict(zip(m.names(), m.end()))
            if not self._gpu_at_start and m.wants_gpu():
                deltas.update(m.since_cuda_init())
                m.attach_gpu()
        except MemprobeError as e:
            self._say(f"･ memprobe: cannot measure this cell: {e}")
            return
        number = getattr(result, "execution_count", None)
        record = CellRecord(number, t1 / 1e9 - self._t0, deltas)
        self.history.append(record)
        self._say(format_line(record))
        self.last_cost_ns = self._pre_ns + (time.perf_counter_ns() - t1)

    def _say(self, text: str) -> None:
        print(text, file=self.file, flush=True)

    # --- %memprobe and %%memprobe ------------------------------------------------

    def magic(self, line: str, cell: Optional[str] = None) -> Any:
        """``%memprobe [on|off]`` and ``%%memprobe`` (see the module's
        documentation)."""
        arg = line.strip()
        if cell is not None:
            if arg:
                return self._usage(f"%%memprobe takes no arguments, got {arg!r}")
            return self.measure_cell(cell)
        if arg == "on":
            self.on()
        elif arg == "off":
            self.off()
        elif arg == "":
            state = "on" if self.enabled else "off"
            m = self._measured
            names = ", ".join(m.names()) if m is not None else "-"
            why = f"; no GPU sources: {m.gpu_error}" if m is not None and m.gpu_error else ""
            self._say(f"memprobe per-cell line: {state} (sources: {names}{why})")
        else:
            return self._usage(f"usage: %memprobe [on|off], or %%memprobe as a cell's first line; got {arg!r}")
        return None

    def _usage(self, message: str) -> None:
        try:
            from IPython.core.error import UsageError
        except ImportError:  # pragma: no cover - a shell without IPython
            raise ValueError(message) from None
        raise UsageError(message)

    def measure_cell(self, cell: str) -> Any:
        """Runs ``cell`` in the shell's namespace (its last expression is
        the result, as a cell's) inside its own window, and prints a table
        per source."""
        m = _Measured(self.torch_sources)
        gpu_at_start = m.gpu is not None
        value: Any = None
        try:
            m.begin()
            t0 = time.perf_counter()
            try:
                value = self._run(cell)
            finally:
                seconds = time.perf_counter() - t0
                deltas = dict(zip(m.names(), m.end()))
                if not gpu_at_start and m.wants_gpu():
                    deltas.update(m.since_cuda_init())
                # No cell number: IPython counts the running cell differently across versions.
                self._say(format_table(CellRecord(None, seconds, deltas)))
        finally:
            m.close()
        return value

    def _run(self, cell: str) -> Any:
        # As IPython's %%time: the cell transformed as a cell is, run in the
        # user's namespace; a last expression is evaluated and returned.
        shell = self.shell
        source = shell.transform_cell(cell)
        tree = shell.compile.ast_parse(source)
        tree = shell.transform_ast(tree)
        last: Optional[ast.Expression] = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        name = "<memprobe cell>"
        exec(shell.compile(tree, name, "exec"), shell.user_ns)
        if last is not None:
            return eval(shell.compile(last, name, "eval"), shell.user_ns)
        return None

    # --- lifetime ----------------------------------------------------------------

    def register_magic(self) -> None:
        self.shell.register_magic_function(self.magic, magic_kind="line_cell", magic_name="memprobe")
        self._magic_registered = True

    def close(self) -> None:
        """Turns the hook off and removes the magic."""
        self.off()
        if self._magic_registered:
            magics = getattr(getattr(self.shell, "magics_manager", None), "magics", {})
            for kind in ("line", "cell"):
                if magics.get(kind, {}).get("memprobe") == self.magic:
                    del magics[kind]["memprobe"]
            self._magic_registered = False


_LOADED: Dict[int, NotebookMemory] = {}


def current(shell: Any = None) -> Optional[NotebookMemory]:
    """The extension loaded in ``shell`` (default: the running IPython's),
    or None."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return None
        shell = get_ipython()
    return _LOADED.get(id(shell)) if shell is not None else None


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext memprobe``: the ``%memprobe`` magic, and the per-cell
    line from the next cell on."""
    if id(ipython) in _LOADED:
        return
    ext = NotebookMemory(ipython)
    ext.register_magic()
    ext.on()
    _LOADED[id(ipython)] = ext


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext memprobe``: the per-cell line and the magic go."""
    ext = _LOADED.pop(id(ipython), None)
    if ext is not None:
        ext.close()
