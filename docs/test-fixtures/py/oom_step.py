"""docs-test fixture: a tracker, a step and the size it asks for, as a
training script has them; torch imported (the block catches its error)."""

import torch  # noqa: F401  (the block names torch.cuda.OutOfMemoryError)

import memprobe

tracker = memprobe.Tracker()
size = 1 << 30


def step() -> None:
    held = bytearray(4 << 20)
    del held
