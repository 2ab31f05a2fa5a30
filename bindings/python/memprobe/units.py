"""Unit helpers: memprobe speaks bytes; MiB appears only in fastai-style helpers."""

from __future__ import annotations

from ._ffi import C

MiB = 1 << 20


def b2mb(num: int) -> int:
    """fastai's ``b2mb``: bytes to MiB, rounded toward zero (``int(num / 2**20)``).

    Non-negative values go through the library's ``memprobe_b2mb``; a negative
    delta rounds toward zero as fastai's does."""
    num = int(num)
    if num >= 0:
        return int(C.memprobe_b2mb(num))
    return -int(C.memprobe_b2mb(-num))
