"""docs-test fixture: a training step and an evaluation that use memory
for a moment, for the blocks that call them."""


def train_step() -> None:
    held = bytearray(32 << 20)
    del held


def evaluate() -> None:
    held = bytearray(64 << 20)
    del held
