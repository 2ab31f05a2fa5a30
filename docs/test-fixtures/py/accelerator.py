"""docs-test fixture: an Accelerator with its prepared model, optimizer and
loader, as a training script has them before its loop (the tiny model of
hf_model.py)."""

from accelerate import Accelerator

exec(open(__file__.replace("accelerator.py", "hf_model.py")).read())
accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # noqa: F821
