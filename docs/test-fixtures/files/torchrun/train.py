"""docs-test fixture: train.py for the README's torchrun line. Two gloo
ranks on CPU, each with a memprobe tracker (it reads RANK, LOCAL_RANK and
WORLD_SIZE from torchrun); rank 1 holds 256 MiB for a moment in one step."""

import time

import torch
import torch.distributed as dist

import memprobe

dist.init_process_group("gloo")
rank = dist.get_rank()
t = memprobe.Tracker(memprobe.Source.process())
x = torch.ones(1024)
for epoch in range(2):
    with t.epoch():
        for step in range(4):
            with t.step():
                dist.all_reduce(x)
                if rank == 1 and (epoch, step) == (1, 2):
                    spike = b"\x01" * (256 << 20)
                    del spike
                time.sleep(0.01)
t.close()
dist.barrier()
dist.destroy_process_group()
