"""A training loop whose third epoch leaks 8 MiB per step: run it in a
container with little memory under ``memprobe run`` to see how a kernel OOM
kill is explained (the README's "Why did my job die?")::

    systemd-run --user --scope -p MemoryMax=256M -p MemorySwapMax=0 \\
        memprobe run -- python leaky_epoch.py
    docker run --memory 256m --memory-swap 256m ... memprobe run -- python leaky_epoch.py

The tracker sends its epochs and steps to ``memprobe run``, which names the
phase the process was killed in.
"""

import time

import memprobe
from memprobe import PhaseKind

tracker = memprobe.Tracker([memprobe.Source.process()])
kept = []
for epoch in range(5):
    tracker.begin(PhaseKind.EPOCH)
    for step in range(40):
        tracker.begin(PhaseKind.STEP)
        batch = bytearray(2 << 20)  # a step's temporary memory
        if epoch == 2:
            leak = bytearray(8 << 20)  # kept across steps: the leak
            leak[::4096] = b"x" * len(leak[::4096])
            kept.append(leak)
        time.sleep(0.005)
        tracker.end(PhaseKind.STEP)
    tracker.end(PhaseKind.EPOCH)
print("finished")
