"""Traces: fastai's GPUMemTrace over any sources (default: this process's RSS).

Definitions (fastai): *delta used* = used now - used at start; *delta
peaked* = max(0, peak - used at start), minus delta used when delta used is
positive. Reports print ``△Used Peaked MB: <used> <peaked> (<ctx>: <note>)``.
"""

from __future__ import annotations

import functools
import sys
from ctypes import byref, c_bool, c_int64, c_size_t, c_uint64, create_string_buffer
from typing import Any, Callable, Iterable, List, Optional, TextIO, Tuple, TypeVar, Union

from . import _ffi
from ._ffi import C, check
from ._owned import Owned
from .errors import BufferTooSmallError, Status
from .sources import Source, as_sources, check_over
from .units import b2mb
from .windows import Delta

F = TypeVar("F", bound=Callable[..., Any])


def _note(note: Optional[str]) -> Optional[bytes]:
    return None if note is None else str(note).encode()


class Trace(Owned):
    """Delta used and delta peaked of ``sources`` since the trace started.

    ``Trace(sources=None, *, ctx=None, silent=False, on_exit_report=True,
    start=True, file=None, fd=None)``

    - ``sources``: a :class:`Source`, a list of them, or None for this
      process's RSS (exact peaks).
    - ``ctx``: context printed in every report, ``(<ctx>: <note>)``.
    - ``silent``: :meth:`report` prints nothing (``data`` still works); also
      a settable property, as in fastai.
    - ``on_exit_report``: as a context manager, report ``"exit"`` on leaving.
    - ``start``: start measuring now (else call :meth:`start`).
    - ``file``: where reports are printed (default: ``sys.stdout`` at the time
      of the report, as fastai's ``print``); ``fd``: a file descriptor
      written by the library instead.

    Used as a context manager, measurement (re)starts on entry and stops on
    exit; :func:`mem_trace` decorates a function the same way.
    """

    _FREE = "memprobe_trace_free"

    def __init__(
        self,
        sources: Union[Source, Iterable[Source], None] = None,
        *,
        ctx: Optional[str] = None,
        silent: bool = False,
        on_exit_report: bool = True,
        start: bool = True,
        file: Optional[TextIO] = None,
        fd: Optional[int] = None,
    ):
        self._sources: Tuple[Source, ...] = tuple(as_sources(sources))
        self.ctx = ctx
        self.on_exit_report = on_exit_report
        self._silent = bool(silent)
        self._file = file
        self._line_cb = None
        self._closed = True
        flags = (_ffi.MEMPROBE_TRACE_SILENT if silent else 0) | (
            0 if start else _ffi.MEMPROBE_TRACE_DEFERRED
        )
        arr, n = _ffi.handles(self._sources)
        h = _ffi.out_handle()
        check_over(C.memprobe_trace_new(arr, n, _note(ctx), flags, byref(h)), self._sources)
        self._handle = h.value
        self._closed = False
        if fd is not None:
            check(C.memprobe_trace_set_output_fd(self._handle, int(fd)))
        else:
            self._line_cb = _ffi.memprobe_line_fn(self._print_line)
            check(C.memprobe_trace_set_output_callback(self._handle, self._line_cb, None))

    def _print_line(self, line: bytes, _user_data: Any) -> None:
        try:
            print(line.decode("utf-8", "replace"), file=self._file or sys.stdout)
        except Exception:  # noqa: BLE001 - never raise into the library
            pass

    # --- measuring -----------------------------------------------------------

    @property
    def sources(self) -> Tuple[Source, ...]:
        return self._sources

    def start(self) -> None:
        """Starts measuring (:class:`~memprobe.WrongOrderError` if running)."""
        check_over(C.memprobe_trace_start(self._handle), self._sources)

    def stop(self) -> None:
        """Stops and freezes the data (:class:`~memprobe.WrongOrderError` if
        not running)."""
        check_over(C.memprobe_trace_stop(self._handle), self._sources)

    def reset(self) -> None:
        """Restarts the counters of a running trace."""
        check_over(C.memprobe_trace_reset(self._handle), self._sources)

    @property
    def running(self) -> bool:
        out = c_bool()
        check(C.memprobe_trace_is_running(self._handle, byref(out)))
        return bool(out.value)

    def data(self, index: int = 0) -> Tuple[int, int]:
        """``(delta_used, delta_peaked)`` of source ``index``, in bytes."""
        used, peaked = c_int64(), c_uint64()
        check_over(C.memprobe_trace_data(self._handle, index, byref(used), byref(peaked)), self._sources)
        return int(used.value), int(peaked.value)

    def data_mb(self, index: int = 0) -> Tuple[int, int]:
        """fastai's ``data()``: ``(delta_used, delta_peaked)`` in MiB, rounded
        toward zero (``b2mb``)."""
        used, peaked = self.data(index)
        return b2mb(used), b2mb(peaked)

    def measure(self, index: int = 0) -> Delta:
        """Everything measured for source ``index`` (start, end, peak, deltas)."""
        d = _ffi.memprobe_delta()
        check_over(C.memprobe_trace_measure(self._handle, index, byref(d)), self._sources)
        return Delta._from_c(d)

    def measures(self) -> List[Delta]:
        return [self.measure(i) for i in range(len(self._sources))]

    # --- reporting -----------------------------------------------------------

    def report(self, note: Optional[str] = None) -> None:
        """Prints ``△Used Peaked MB: <used> <peaked> (<ctx>: <note>)`` unless silent."""
        check_over(C.memprobe_trace_report(self._handle, _note(note)), self._sources)

    def report_n_reset(self, note: Optional[str] = None) -> None:
        """:meth:`report`, then :meth:`reset` (needs a running trace)."""
        check_over(C.memprobe_trace_report_n_reset(self._handle, _note(note)), self._sources)

    def format(self, note: Optional[str] = None) -> str:
        """The report line for ``note``, without printing it."""
        size = 256
        while True:
            buf = create_string_buffer(size)
            needed = c_size_t()
            status = C.memprobe_trace_format(self._handle, _note(note), buf, size, byref(needed))
            if status == Status.BUFFER_TOO_SMALL and needed.value > size:
                size = int(needed.value)
                continue
            try:
                check(status)
            except BufferTooSmallError:  # pragma: no cover - the loop resizes
                raise
            return buf.value.decode("utf-8", "replace")

    @property
    def silent(self) -> bool:
        """Whether :meth:`report` is silenced (settable, as in fastai)."""
        return self._silent

    @silent.setter
    def silent(self, value: bool) -> None:
        check(C.memprobe_trace_set_silent(self._handle, bool(value)))
        self._silent = bool(value)

    def set_output(self, file: Optional[TextIO] = None, *, fd: Optional[int] = None) -> None:
        """Sends reports to a text stream (default ``sys.stdout``) or a file
        descriptor written directly by the library."""
        if fd is not None:
            check(C.memprobe_trace_set_output_fd(self._handle, int(fd)))
            return
        self._file = file
        cb = _ffi.memprobe_line_fn(self._print_line)
        check(C.memprobe_trace_set_output_callback(self._handle, cb, None))
        self._line_cb = cb

    # --- lifetime ------------------------------------------------------------

    def __enter__(self) -> "Trace":
        if self.running:
            self.reset()
        else:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._closed:
            return
        if self.on_exit_report:
            self.report("exit")
        if self.running:
            self.stop()


    def __repr__(self) -> str:
        if self._closed:
            return "<memprobe.Trace (closed)>"
        return self.format()

    __str__ = __repr__


def mem_trace(
    func: Optional[F] = None,
    *,
    sources: Union[Source, Iterable[Source], None] = None,
    ctx: Optional[str] = None,
    silent: bool = False,
    file: Optional[TextIO] = None,
) -> Union[F, Callable[[F], F]]:
    """fastai's ``gpu_mem_trace`` decorator over any sources: every call of
    the function runs in a :class:`Trace` that reports
    ``(<qualname>: exit)`` when it returns (or raises)::

        @memprobe.mem_trace
        def train_epoch(): ...

        @memprobe.mem_trace(ctx="eval", sources=[rss, tree])
        def evaluate(): ...
    """

    def decorate(f: F) -> F:
        label = ctx or getattr(f, "__qualname__", getattr(f, "__name__", "function"))

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = Trace(sources, ctx=label, silent=silent, file=file, start=False)
            try:
                with t:
                    return f(*args, **kwargs)
            finally:
                t.close()

        return wrapper  # type: ignore[return-value]

    if func is not None:
        return decorate(func)
    return decorate
