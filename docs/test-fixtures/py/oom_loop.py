"""docs-test fixture: a loader of two batches and a training step that
uses memory for a moment (on a machine without a GPU nothing runs out)."""

loader = [0, 1]


def train(batch: int) -> None:
    held = bytearray(4 << 20)
    del held
