"""Unit helpers: memprobe speaks bytes; MiB appears only in fastai-style helpers."""

from __future__ import annotations

from ._ffi import C

MiB = 1 << 20


def b2mb(num: int) -> int:
    """fastai's ``b2mb``: bytes to MiB, rounded toward zero (``int(num / 2**20)``).

    Non-negative values go through the library's ``memprobe_b2mb``, negative
    ones (a delta) through ``memprobe_b2mb_signed``: one definition of the
    rounding, the C ABI's."""
    num = int(num)
    if num >= 0:
        return int(C.memprobe_b2mb(num))
    if num < -(1 << 63):
        raise OverflowError(f"{num} bytes is below the int64 range of a delta")
    return int(C.memprobe_b2mb_signed(num))
