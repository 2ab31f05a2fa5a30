"""Ownership of one C handle, shared by every class that holds one."""

from typing import TYPE_CHECKING, Optional, TypeVar

from ._ffi import C, check

_Self = TypeVar("_Self", bound="Owned")


class Owned:
    """Holds one memprobe handle and frees it exactly once: by :meth:`close`,
    at the end of a ``with`` block, or when the object is collected (errors
    are ignored there: the interpreter may be shutting down).

    Subclasses name their C free function in ``_FREE`` and set
    ``self._handle`` and ``self._closed = False`` once the handle exists.
    """

    if TYPE_CHECKING:
        # Set by subclasses, in their __slots__ or __dict__.
        _handle: Optional[int]
    else:
        __slots__ = ()  # subclasses may use __slots__ (and __weakref__)
    _FREE = ""
    _closed: bool = True

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Releases the handle (idempotent)."""
        if not self._closed:
            self._closed = True
            check(getattr(C, self._FREE)(self._handle))

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self._closed = True
                getattr(C, self._FREE)(self._handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
