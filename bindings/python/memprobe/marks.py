"""Exact sources over marks the caller keeps: a framework allocator's bytes
in use and high-water mark, with one reset shared by the whole group.

PyTorch keeps one allocated and one reserved high-water mark per device and
``torch.cuda.reset_peak_memory_stats`` resets them all at once. A
:class:`MarkGroup` describes such a group with three functions; each
:meth:`MarkGroup.source` over one of its marks is an exact source (no
polling) that windows, traces, trackers and the exporter use like the
process source: at every window boundary memprobe folds the mark into every
open window, carries the other members' marks, then resets the group, so
any number of nested and concurrent windows keep exact peaks::

    stats = {"now": [0, 0], "peak": [0, 0]}
    group = MarkGroup(
        current=lambda i: stats["now"][i],
        peak=lambda i: stats["peak"][i],
        reset=lambda: stats["peak"].__setitem__(slice(None), stats["now"]),
    )
    alloc, reserved = group.source(0, "alloc"), group.source(1, "reserved")

When one read of the framework gives every mark (PyTorch's statistics
dictionary), :meth:`MarkGroup.many` takes one function that reads several
marks at once: a window boundary then calls it twice and ``reset`` once,
whatever the number of sources over the group.

The functions are called on the thread that reads a source or opens, resets
or closes a window over one of the group's sources (or on an exporter's
thread for a scrape), one at a time per group, never by the monitor thread.
They must not call memprobe on the group's own sources. An exception in one
fails the memprobe call that needed it: that call raises the library's
:class:`~memprobe.UnavailableError` with the exception as its ``__cause__``,
and every window keeps its peak.
"""

from __future__ import annotations

import enum
from ctypes import byref
from typing import Any, Callable, Dict, List, Sequence, Tuple, Type

from . import _ffi, sources
from ._ffi import C, check
from ._owned import Owned
from .sources import Source


class MarkValue(enum.IntEnum):
    """``memprobe_mark_value``: which value of its marks a
    :meth:`MarkGroup.many` reader is asked for."""

    #: The bytes in use now.
    CURRENT = 0
    #: The high-water mark since the group's last reset.
    PEAK = 1


def _c_reset(reset: Callable[[], None], errors: List[BaseException]) -> Callable[[Any], int]:
    def c_reset(_user_data: Any) -> int:
        if sources._finalizing:
            return 1
        try:
            reset()
            return 0
        except BaseException as e:  # noqa: BLE001 - reported through the status
            errors[:] = [e]
            return 1

    return c_reset


class MarkGroup(Owned):
    """A group of resettable marks: ``current(index)`` returns the bytes in
    use of mark ``index``, ``peak(index)`` its high-water mark since the last
    reset, ``reset()`` resets every mark of the group to its current value.
    Close it (or let it be collected) when no more sources are needed: the
    sources made over it keep the group and its functions alive."""

    _FREE = "memprobe_mark_group_free"

    def __init__(
        self,
        current: Callable[[int], int],
        peak: Callable[[int], int],
        reset: Callable[[], None],
    ):
        self._closed = True
        errors: List[BaseException] = []

        def read(fn: Callable[[int], int], what: str) -> Callable[[Any, int, Any], int]:
            def c_read(_user_data: Any, index: int, out: Any) -> int:
                if sources._finalizing:
                    return 1
                try:
                    value = int(fn(index))
                    if value < 0:
                        raise ValueError(f"{what}({index}) returned {value} bytes")
                    out[0] = value
                    return 0
                except BaseException as e:  # noqa: BLE001 - reported through the status
                    errors[:] = [e]
                    return 1

            return c_read

        self._errors = errors
        # The ctypes callbacks: kept by the group and by every source over it,
        # since C may call them until the last of those is freed.
        self._callbacks: Tuple[Any, ...] = (
            _ffi.memprobe_mark_read_fn(read(current, "current")),
            _ffi.memprobe_mark_read_fn(read(peak, "peak")),
            _ffi.memprobe_mark_reset_fn(_c_reset(reset, errors)),
        )
        h = _ffi.out_handle()
        check(C.memprobe_mark_group_new(*self._callbacks, None, byref(h)))
        self._handle = h.value
        self._closed = False

    @classmethod
    def many(
        cls,
        read_many: Callable[[str, Sequence[int]], Sequence[int]],
        reset: Callable[[], None],
    ) -> "MarkGroup":
        """A group whose marks are read several at once:
        ``read_many(what, indices)`` returns, in order, the value ``what``
        (``"current"``: bytes in use now; ``"peak"``: the high-water mark
        since the last reset) of each mark in ``indices``. Same sources and
        same peaks as :class:`MarkGroup`, fewer calls: a window boundary over
        any number of the group's sources calls ``read_many`` twice and
        ``reset`` once (``memprobe_mark_group_new_many``)."""
        self = cls.__new__(cls)
        self._closed = True
        errors: List[BaseException] = []
        names: Dict[int, str] = {int(MarkValue.CURRENT): "current", int(MarkValue.PEAK): "peak"}

        def c_read_many(_user_data: Any, what: int, indices: Any, count: int, out: Any) -> int:
            if sources._finalizing:
                return 1
            try:
                name = names[what]
                wanted = [indices[i] for i in range(count)]
                values = list(read_many(name, wanted))
                if len(values) != count:
                    raise ValueError(f"read_many({name!r}, {wanted}) returned {len(values)} values, not {count}")
                for i, v in enumerate(values):
                    v = int(v)
                    if v < 0:
                        raise ValueError(f"read_many({name!r}, ...) returned {v} bytes for mark {wanted[i]}")
                    out[i] = v
                return 0
            except BaseException as e:  # noqa: BLE001 - reported through the status
                errors[:] = [e]
                return 1

        self._errors = errors
        self._callbacks = (
            _ffi.memprobe_mark_read_many_fn(c_read_many),
            _ffi.memprobe_mark_reset_fn(_c_reset(reset, errors)),
        )
        h = _ffi.out_handle()
        check(C.memprobe_mark_group_new_many(*self._callbacks, None, byref(h)))
        self._handle = h.value
        self._closed = False
        return self

    def source(self, index: int, name: str) -> Source:
        """An exact source over mark ``index`` named ``name`` (1 to 64
        printable bytes). One live source per index (a second one is
        :class:`~memprobe.InvalidArgumentError` until the first is closed
        along with every window over it)."""
        return self._source(index, name, Source)

    def _source(self, index: int, name: str, cls: Type[Source]) -> Source:
        # ``cls``: a Source subclass (the torch integration's shared sources).
        if index < 0:
            raise ValueError(f"mark index must be >= 0, not {index}")
        src = cls._new(C.memprobe_source_new_mark, self._handle, int(index), name.encode(), keep=self._callbacks)
        src._callback_error = self._errors
        return src

    def __repr__(self) -> str:
        return f"<memprobe.MarkGroup {'closed' if self._closed else 'open'}>"


__all__ = ["MarkGroup", "MarkValue"]
