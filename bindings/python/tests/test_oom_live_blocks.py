"""The PyTorch out-of-memory report carries what was live: with
attribution on, the observer hands the report the ``oom`` record itself
(not only its path), which the report embeds as ``live_blocks`` (the
blocks with their frames, the requested size, the segments) and
summarises (its top blocks with file:line, the fragmentation). A record
the report refuses leaves the report whole, saying why."""

from __future__ import annotations

import inspect
import json

import pytest

from conftest import MiB


def test_the_report_embeds_and_summarises_the_live_blocks(torch_fake_cuda, tmp_path):
    import torch

    import memprobe
    from memprobe.integrations.torch import allocator_sources, report_oom

    src = allocator_sources(0, attribution=True)
    t = memprobe.Tracker(src)
    got = []
    report = tmp_path / "oom.json"
    report_oom(t, path=str(report), callback=lambda j, s: got.append((j, s)))
    line = inspect.currentframe().f_lineno + 1
    held = torch_fake_cuda.alloc(3 << 30)
    small = torch_fake_cuda.alloc(MiB)
    pending = torch_fake_cuda.alloc(MiB)
    torch_fake_cuda.free(addr=pending, pending=True)  # freed, a stream still on it: not allocated
    with t.epoch():
        with t.step():
            with pytest.raises(torch.cuda.OutOfMemoryError):
                torch_fake_cuda.oom(20 << 30)
    assert len(got) == 1
    doc = json.loads(report.read_text())
    assert doc == json.loads(got[0][0])
    assert doc["live_blocks_error"] is None
    live = doc["live_blocks"]
    record = json.loads((tmp_path / "attribution" / "oom-0-rank-0.json").read_text())
    assert live == record  # the record as written, nothing rebuilt
    assert live["schema"] == "memprobe.torch_attribution/1" and live["kind"] == "oom"
    assert live["requested_bytes"] == 20 << 30 == doc["failed_allocation"]["requested_bytes"]
    assert [b["address"] for b in live["blocks"]][:2] == [held, small]
    top = live["blocks"][0]["frames"][0]
    assert (top["file"], top["line"]) == (__file__, line)
    segs = {s["address"]: s for s in live["segments"]}
    assert segs[pending]["allocated"] == 0 and segs[pending]["bytes"] == 2 * MiB
    summary = got[0][1]
    assert "  live blocks (" in summary and "; 20.0 GiB asked):\n" in summary
    assert f"  3.00 GiB {__file__}:{line} " in summary
    reserved = sum(s["bytes"] for s in live["segments"])
    allocated = sum(s["allocated"] for s in live["segments"])
    assert reserved - allocated >= 2 * MiB
    assert f" reserved in {len(segs)} segments, " in summary.split("  fragmentation: ")[1]
    t.close()
    src.close()


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"schema": "memprobe.torch_attribution/1"', "not JSON: unexpected end"),
        ('{"schema": "memprobe.torch_attribution/9"}', "schema is"),
        ('{"schema": "memprobe.torch_attribution/1", "x": "' + "x" * (256 * 1024) + '"}', "bytes allowed"),
        ('{"schema": "\ud800"}', "not UTF-8"),
    ],
)
def test_a_refused_record_leaves_the_report_whole(tmp_path, text, why):
    import memprobe

    src = memprobe.Source.pushed("torch_alloc:0")
    t = memprobe.Tracker([src])
    got = []
    t.set_oom_report(callback=lambda j, s: got.append((j, s)))
    try:
        t.report_oom(0, 1 << 30, reported_by="torch", live_blocks_json=text)
    finally:
        t.close()
        src.close()
    doc = json.loads(got[0][0])
    assert doc["live_blocks"] is None and why in doc["live_blocks_error"]
    assert f"  live blocks: left out ({doc['live_blocks_error']})\n" in got[0][1]
