"""Replay of torch's allocator history to a step's peak, on snapshots
written here in the format ``torch.cuda.memory._snapshot()`` documents
(``segments`` with ``blocks``; ``device_traces`` of alloc / free_requested /
free_completed / segment_* entries with ``time_us`` and ``frames``)."""

from __future__ import annotations

import json

import pytest

from memprobe.integrations.torch_attribution import record as rec
from memprobe.integrations.torch_attribution.frames import user_frames
from memprobe.integrations.torch_attribution.modules import ModuleTimeline
from memprobe.integrations.torch_attribution.replay import Block, Replay, block_size, replay_peak

MiB = 1 << 20
TORCH_FILE = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"


def frame(file, line, name):
    return {"filename": file, "line": line, "name": name}


def user(line, name="forward"):
    return [frame(TORCH_FILE, 1736, "_call_impl"), frame("train.py", line, name), frame(TORCH_FILE, 10, "x")]


def ev(action, addr, size, t, stream=0, frames=None):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t, "frames": frames or []}


def snapshot(live, trace, device=0, pending=()):
    """``live``: (address, size, stream, frames) allocated at the snapshot;
    ``pending``: (address, size, stream) whose free is requested, not completed."""
    segments = []
    for addr, size, stream, frames in live:
        segments.append(
            {"device": device, "address": addr, "total_size": 2 * size, "allocated_size": size, "stream": stream,
             "blocks": [{"address": addr, "size": size, "state": "active_allocated", "frames": frames},
                        {"address": addr + size, "size": size, "state": "inactive", "frames": []}]}
        )
    for addr, size, stream in pending:
        segments.append(
            {"device": device, "address": addr, "total_size": size, "allocated_size": 0, "stream": stream,
             "blocks": [{"address": addr, "size": size, "state": "active_pending_free", "frames": []}]}
        )
    traces = [[] for _ in range(device + 1)]
    traces[device] = trace
    return {"segments": segments, "device_traces": traces}


def sizes(replay):
    return sorted((b.address, b.bytes) for b in replay.blocks)


def test_the_peak_inside_a_step_is_the_moment_with_most_allocated():
    # A (1 MiB) held from before the step; inside it B (4 MiB) and C (2 MiB)
    # live together, then B goes and D (1 MiB) comes: the peak is A+B+C.
    a, b, c, d = 0x1000000, 0x2000000, 0x3000000, 0x4000000
    trace = [
        ev("alloc", a, MiB, 100, frames=user(10, "setup")),
        ev("alloc", b, 4 * MiB, 210, frames=user(42)),
        ev("alloc", c, 2 * MiB, 220, frames=user(43)),
        ev("free_requested", b, 4 * MiB, 230),
        ev("free_completed", b, 4 * MiB, 231),
        ev("alloc", d, MiB, 240, frames=user(44)),
    ]
    snap = snapshot([(a, MiB, 0, user(10, "setup")), (c, 2 * MiB, 0, user(43)), (d, MiB, 0, user(44))], trace)
    r = replay_peak(snap, 0, start_us=200, end_us=300, peak_bytes=7 * MiB, recording_since_us=50)
    assert r.complete and r.replay_bytes == 7 * MiB
    assert [x.bytes for x in r.blocks] == [4 * MiB, 2 * MiB, MiB]
    assert r.blocks[0].address == b and r.blocks[0].frames[1]["line"] == 42  # from its alloc entry
    assert r.peak_index == 2  # right after C's allocation

    out = rec.build(r, kind="epoch_peak", top=2, peak_bytes=7 * MiB, epoch=1, step=5, stage="train", rank_=0)
    assert [x["bytes"] for x in out["blocks"]] == [4 * MiB, 2 * MiB]
    assert out["blocks"][0]["frames"] == [{"file": "train.py", "line": 42, "function": "forward"}]
    assert out["rest"] == {"bytes": MiB, "blocks": 1, "unplaced_bytes": 0}
    assert sum(x["bytes"] for x in out["blocks"]) + out["rest"]["bytes"] == out["peak_bytes"]
    assert out["schema"] == rec.SCHEMA and out["history"] == {"complete": True, "entries": 6, "lost_entries": False}

    # The step before: its own peak (A alone at its end), not this step's.
    r0 = replay_peak(snap, 0, start_us=90, end_us=199, peak_bytes=MiB, recording_since_us=50)
    assert sizes(r0) == [(a, MiB)]


def test_streams_are_kept_per_block():
    a, b = 0x10000, 0x20000
    trace = [ev("alloc", a, 3 * MiB, 110, stream=0, frames=user(1)), ev("alloc", b, 5 * MiB, 120, stream=7, frames=user(2)),
             ev("free_requested", b, 5 * MiB, 130, stream=7), ev("free_completed", b, 5 * MiB, 131, stream=7)]
    snap = snapshot([(a, 3 * MiB, 0, user(1))], trace)
    r = replay_peak(snap, 0, start_us=100, end_us=200, peak_bytes=8 * MiB, recording_since_us=0)
    assert [(x.address, x.stream) for x in r.blocks] == [(b, 7), (a, 0)]


def test_free_requested_ends_a_block_not_free_completed():
    # X is freed (requested) at 220 while a stream still uses it (completed
    # only after the snapshot: pending there); Y comes at 230. torch's
    # allocated bytes fall at the request: the peak is X alone, 3 MiB, not 5.
    x, y = 0x5000, 0x9000
    trace = [ev("alloc", x, 3 * MiB, 210, frames=user(1)), ev("free_requested", x, 3 * MiB, 220),
             ev("alloc", y, 2 * MiB, 230, frames=user(2))]
    snap = snapshot([(y, 2 * MiB, 0, user(2))], trace, pending=[(x, 3 * MiB, 0)])
    r = replay_peak(snap, 0, start_us=200, end_us=300, peak_bytes=3 * MiB, recording_since_us=0)
    assert r.complete and sizes(r) == [(x, 3 * MiB)]
    # Without memprobe's peak to bound it, the same: 3 MiB is the most ever allocated.
    assert sizes(replay_peak(snap, 0, start_us=200, end_us=300, recording_since_us=0)) == [(x, 3 * MiB)]


def test_segment_events_move_no_allocated_bytes():
    a, b = 0x100000, 0x300000
    trace = [ev("segment_alloc", 0x100000, 20 * MiB, 205), ev("alloc", a, 6 * MiB, 206, frames=user(1)),
             ev("segment_map", 0x200000, 2 * MiB, 207), ev("alloc", b, MiB, 208, frames=user(2)),
             ev("free_requested", a, 6 * MiB, 209), ev("free_completed", a, 6 * MiB, 210),
             ev("segment_unmap", 0x200000, 2 * MiB, 211), ev("segment_free", 0x100000, 20 * MiB, 212),
             ev("snapshot", 0, 0, 213)]
    snap = snapshot([(b, MiB, 0, user(2))], trace)
    r = replay_peak(snap, 0, start_us=200, end_us=300, peak_bytes=7 * MiB, recording_since_us=0)
    assert r.complete and r.replay_bytes == 7 * MiB and sizes(r) == [(a, 6 * MiB), (b, MiB)]


def test_a_ring_buffer_that_dropped_the_steps_start_is_reported_not_guessed():
    # max_entries 4, all four inside the step: what the step allocated before
    # them (and freed since) is gone.
    blocks = [0x1000 * (i + 1) for i in range(4)]
    trace = [ev("free_requested", blocks[0], MiB, 301), ev("free_completed", blocks[0], MiB, 302),
             ev("alloc", blocks[1], MiB, 303, frames=user(3)), ev("alloc", blocks[2], MiB, 304, frames=user(4))]
    snap = snapshot([(blocks[1], MiB, 0, user(3)), (blocks[2], MiB, 0, user(4))], trace)
    r = replay_peak(snap, 0, start_us=300, end_us=400, peak_bytes=9 * MiB, max_entries=4, recording_since_us=0)
    assert not r.complete and r.lost_entries and r.blocks == [] and "ring buffer" in r.reason
    out = rec.build(r, kind="epoch_peak", top=10, peak_bytes=9 * MiB, epoch=0, step=3, stage="train", rank_=0)
    assert out["blocks"] == [] and out["rest"]["bytes"] is None
    assert out["history"]["complete"] is False and out["history"]["lost_entries"] is True

    # The same ring with one entry from before the step: complete.
    older = [ev("alloc", 0x9999, 512, 250)] + trace[1:]
    snap2 = snapshot([(0x9999, 512, 0, []), (blocks[1], MiB, 0, user(3)), (blocks[2], MiB, 0, user(4))], older)
    r2 = replay_peak(snap2, 0, start_us=300, end_us=400, peak_bytes=2 * MiB + 512, max_entries=4, recording_since_us=0)
    assert r2.complete and r2.replay_bytes == 2 * MiB + 512
    # A history begun after the step's start, never full: incomplete too.
    r3 = replay_peak(snap, 0, start_us=300, end_us=400, peak_bytes=9 * MiB, max_entries=100, recording_since_us=350)
    assert not r3.complete and not r3.lost_entries and "began after" in r3.reason


def test_frameless_backward_blocks_are_named_by_their_forward_module():
    # Backward: autograd's thread gives torch's frames only. The module
    # timeline says whose backward ran (decoder from 500, encoder from 520).
    g1, g2, w = 0xA000, 0xB000, 0xC000
    trace = [ev("alloc", w, 2 * MiB, 400, frames=user(7)),
             ev("alloc", g1, 8 * MiB, 505, frames=[frame(TORCH_FILE, 3, "backward")]),
             ev("alloc", g2, 4 * MiB, 525, frames=[])]
    snap = snapshot([(w, 2 * MiB, 0, user(7)), (g1, 8 * MiB, 0, []), (g2, 4 * MiB, 0, [])], trace)
    timeline = ModuleTimeline()
    # A module and the one around it share an output node: the inner
    # module's hook was registered first, so it runs (and is kept) first.
    timeline.record("model.decoder.proj", 500)
    timeline.record("model.decoder", 500)
    timeline.record("model.encoder", 520)
    r = replay_peak(snap, 0, start_us=450, end_us=600, peak_bytes=14 * MiB, recording_since_us=0)
    out = rec.build(r, kind="epoch_peak", top=10, peak_bytes=14 * MiB, module_at=timeline.module_at, rank_=0)
    by_addr = {b["address"]: b for b in out["blocks"]}
    assert by_addr[g1]["frames"] == [] and by_addr[g1]["module"] == "model.decoder.proj"
    assert by_addr[g2]["frames"] == [] and by_addr[g2]["module"] == "model.encoder"
    assert by_addr[w]["module"] is None and by_addr[w]["frames"][0]["line"] == 7
    assert timeline.module_at(499) is None


def test_sizes_the_history_cannot_give_are_unplaced_never_spread():
    # A block freed in the step was asked 1000 bytes: its block is 1024, but
    # an unsplit cached block could be larger; memprobe's peak says 3 MiB.
    a, t = 0x1000, 0x2000
    trace = [ev("alloc", t, 1000, 210, frames=user(5)), ev("free_requested", t, 1000, 220)]
    snap = snapshot([(a, 3 * MiB - 2048, 0, user(1))], trace)
    r = replay_peak(snap, 0, start_us=200, end_us=300, peak_bytes=3 * MiB, recording_since_us=0)
    assert r.complete and r.replay_bytes == 3 * MiB - 1024
    assert [b.bytes for b in r.blocks] == [3 * MiB - 2048, 1024] and not r.blocks[1].exact
    out = rec.build(r, kind="epoch_peak", top=10, peak_bytes=3 * MiB, rank_=0)
    assert out["rest"] == {"bytes": 1024, "blocks": 0, "unplaced_bytes": 1024}
    assert sum(b["bytes"] for b in out["blocks"]) + out["rest"]["bytes"] == 3 * MiB
    assert [block_size(n) for n in (1, 511, 512, 513, 1 << 20)] == [512, 512, 512, 1024, 1 << 20]


def test_a_moment_above_memprobes_peak_lies_outside_the_step():
    # An entry of the step before, in the step's first microsecond (a clock
    # tie): undoing it gives a state above the step's exact peak, not taken.
    a, b = 0x1000, 0x2000
    trace = [ev("alloc", a, 4 * MiB, 190), ev("free_requested", a, 4 * MiB, 200), ev("alloc", b, MiB, 205, frames=user(9))]
    snap = snapshot([(b, MiB, 0, user(9))], trace)
    r = replay_peak(snap, 0, start_us=200, end_us=300, peak_bytes=MiB, recording_since_us=0)
    assert sizes(r) == [(b, MiB)]


def test_user_frames_first_torch_and_memprobe_left_out():
    import os

    import memprobe

    mp = os.path.join(os.path.dirname(memprobe.__file__), "tracker.py")
    frames = [frame(TORCH_FILE, 1, "_call_impl"), frame("/venv/lib/python3.11/site-packages/lightning/pytorch/loops/x.py", 2, "run"),
              frame(mp, 3, "end"), frame("model.py", 4, "forward"), frame("??", 0, "c10::alloc"), frame("train.py", 5, "main")]
    assert user_frames(frames) == [
        {"file": "model.py", "line": 4, "function": "forward"},
        {"file": "train.py", "line": 5, "function": "main"},
        {"file": "/venv/lib/python3.11/site-packages/lightning/pytorch/loops/x.py", "line": 2, "function": "run"},
    ]


def test_a_record_stays_within_256_kib_and_still_sums():
    long = [frame(f"/home/user/project/very/deep/path/{'x' * 200}/m{i}.py", i, "f" * 100) for i in range(20)]
    blocks = [Block(0x1000 * i, 512 * (i + 1), i % 3, list(long)) for i in range(20000)]
    total = sum(b.bytes for b in blocks)
    r = Replay(0, True, 100000, False, total, sorted(blocks, key=lambda b: -b.bytes))
    out = rec.build(r, kind="epoch_peak", top=20000, peak_bytes=total, epoch=0, step=1, stage="train", rank_=0)
    text = json.dumps(out, separators=(",", ":"))
    assert len(text.encode()) <= rec.MAX_BYTES and out["truncated"] is True
    assert 0 < len(out["blocks"]) < 20000
    assert sum(b["bytes"] for b in out["blocks"]) + out["rest"]["bytes"] == total
    assert out["rest"]["blocks"] == 20000 - len(out["blocks"])
    # The largest blocks are the ones kept.
    assert out["blocks"][0]["bytes"] == 512 * 20000


def test_records_are_written_whole(tmp_path):
    path = rec.write({"schema": rec.SCHEMA}, str(tmp_path / "a" / "epoch-0-rank-0.json"))
    assert json.loads(open(path).read()) == {"schema": rec.SCHEMA}
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["epoch-0-rank-0.json"]
    assert rec.file_name("oom", 3, 1) == "oom-3-rank-1.json"
    assert rec.file_name("epoch_peak", 2, 0, 1) == "epoch-2-rank-0-device-1.json"


def test_options_refuse_what_makes_no_sense():
    from memprobe.integrations.torch_attribution import AttributionOptions, as_options

    assert as_options(None) is None and as_options(False) is None
    assert as_options(True) == AttributionOptions()
    assert as_options({"top": 3}).top == 3
    with pytest.raises(ValueError):
        AttributionOptions(top=0)
    with pytest.raises(ValueError):
        AttributionOptions(max_entries=0)
    with pytest.raises(TypeError):
        as_options("yes")
