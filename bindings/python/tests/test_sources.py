"""Sources: readings, info, pushed and callback sources, errors, threads, fork."""

from __future__ import annotations

import os
import threading

import pytest
from conftest import MiB, keep

import memprobe
from memprobe import Fidelity, Source, SourceKind


def statm_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_process_reads_this_process_rss(rss):
    s = rss.read()
    assert isinstance(s, memprobe.Sample)
    assert abs(s.used - statm_rss()) < 4 * MiB
    assert s.total is None and s.free is None and s.limit is None and s.reserved is None
    assert s.taken_at_ns > 0 and s.read_ns >= 0
    assert s.used_mb == s.used >> 20


def test_used_is_the_bytes_alone_and_counts_towards_windows(rss):
    assert abs(rss.used() - statm_rss()) < 4 * MiB
    value = [10]
    with Source.callback("pool", lambda: value[0]) as c, memprobe.Window([c]) as w:
        value[0] = 1000
        assert c.used() == 1000
        value[0] = 5
        assert w.peaks() == [1000], "a value only used() saw is in the window's peak"
    with Source.pushed("p") as p:
        assert p.used() == 0
        p.push(77)
        assert p.used() == 77


def test_process_follows_allocations(rss):
    before = rss.read().used
    held = keep(64 * MiB)
    after = rss.read().used
    assert after - before >= 60 * MiB
    del held


def test_process_info(rss):
    info = rss.info()
    assert info == memprobe.SourceInfo(name=rss.name, kind=SourceKind.PROCESS, fidelity=Fidelity.EXACT)
    assert rss.kind is SourceKind.PROCESS and rss.fidelity is Fidelity.EXACT
    assert "exact" in repr(rss)


def test_preserve_hwm_is_sampled():
    with Source.process(preserve_hwm=True) as s:
        assert s.fidelity is Fidelity.SAMPLED
        assert s.read().used > 0


def test_process_tree_includes_this_process(rss):
    with Source.process_tree() as tree:
        assert tree.kind is SourceKind.PROCESS_TREE
        assert tree.fidelity is Fidelity.SAMPLED
        assert tree.read().used >= rss.read().used - 4 * MiB


def test_system_ram_has_total_and_free():
    with Source.system_ram() as ram:
        s = ram.read()
        assert ram.kind is SourceKind.SYSTEM_RAM
        assert s.total and s.free is not None
        assert 0 < s.used <= s.total


def test_cgroup_reads_or_is_unavailable():
    try:
        cg = Source.cgroup()
    except memprobe.UnavailableError as e:
        assert e.status is memprobe.Status.UNAVAILABLE
        assert e.message
        return
    with cg:
        s = cg.read()
        assert cg.kind is SourceKind.CGROUP
        assert s.used > 0
        if s.limit is not None:
            assert s.free is not None


@pytest.mark.parametrize("metric,kind", [("pss", SourceKind.PROCESS_PSS), ("uss", SourceKind.PROCESS_USS)])
def test_smaps(metric, kind):
    try:
        src = Source.smaps(metric)
    except memprobe.UnavailableError:
        pytest.skip("no /proc/self/smaps_rollup on this kernel")
    with src:
        assert src.kind is kind
        assert src.read().used > 0


def test_smaps_rejects_unknown_metric():
    with pytest.raises(ValueError):
        Source.smaps("rss")
    with pytest.raises(ValueError):
        Source.process_tree_smaps("rss")
    with pytest.raises(memprobe.InvalidArgumentError):
        Source.process_tree_smaps(7)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "metric,kind", [("pss", SourceKind.PROCESS_TREE_PSS), ("uss", SourceKind.PROCESS_TREE_USS)]
)
def test_process_tree_smaps(metric, kind):
    with Source.process_tree_smaps(metric) as src:
        assert src.kind is kind
        assert src.name == "tree_" + metric
        assert src.fidelity is Fidelity.SAMPLED
        assert src.read().used > 0


def test_process_tree_pss_counts_pages_shared_with_a_worker_once():
    """A forked worker shares this process's 64 MiB copy-on-write: the tree's
    summed RSS holds it twice, its PSS once."""
    import os
    import signal

    buf = bytearray(64 * MiB)
    for i in range(0, len(buf), 4096):
        buf[i] = 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: only reads, then waits to be killed
        total = sum(buf[i] for i in range(0, len(buf), 4096))
        os.write(w, b"1" if total else b"0")
        signal.pause()
        os._exit(0)
    try:
        assert os.read(r, 1) == b"1"
        with Source.process_tree() as tree_rss, Source.process_tree_smaps("pss") as tree_pss:
            rss, pss = tree_rss.read().used, tree_pss.read().used
        assert rss >= pss + 64 * MiB * 9 // 10, (rss, pss)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)


def test_pushed_source_returns_what_was_pushed():
    with Source.pushed("allocator") as p:
        assert p.name == "allocator"
        assert p.kind is SourceKind.CUSTOM and p.fidelity is Fidelity.PUSHED
        p.push(123 * MiB)
        assert p.read().used == 123 * MiB
        p.push(0)
        assert p.read().used == 0


def test_push_into_a_read_source_is_unsupported(rss):
    with pytest.raises(memprobe.UnsupportedError) as e:
        rss.push(1)
    assert e.value.status is memprobe.Status.UNSUPPORTED
    assert "memprobe_source_push" in e.value.message


@pytest.mark.parametrize("name", ["", "x" * 65, "bad\nname"])
def test_bad_names_are_invalid_arguments(name):
    with pytest.raises(memprobe.InvalidArgumentError):
        Source.pushed(name)


def test_callback_source_reads_through_python():
    value = [5 * MiB]
    with Source.callback("pool", lambda: value[0]) as c:
        assert c.kind is SourceKind.CUSTOM and c.fidelity is Fidelity.SAMPLED
        assert c.read().used == 5 * MiB
        value[0] = 7 * MiB
        assert c.read().used == 7 * MiB


@pytest.mark.parametrize("method", ["read", "used"])
def test_callback_exception_becomes_the_cause(method: str) -> None:
    def broken() -> int:
        raise RuntimeError("allocator gone")

    with Source.callback("broken", broken) as c:
        with pytest.raises(memprobe.UnavailableError) as e:
            getattr(c, method)()
        assert isinstance(e.value.__cause__, RuntimeError)
        assert "allocator gone" in str(e.value.__cause__)


def test_callback_negative_value_fails():
    with Source.callback("neg", lambda: -1) as c:
        with pytest.raises(memprobe.UnavailableError) as e:
            c.read()
        assert isinstance(e.value.__cause__, ValueError)


def test_closed_source_is_an_invalid_handle():
    s = Source.pushed("gone")
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(memprobe.InvalidHandleError) as e:
        s.read()
    assert e.value.status is memprobe.Status.INVALID_HANDLE
    with pytest.raises(memprobe.InvalidHandleError):
        s.used()
    with pytest.raises(memprobe.InvalidHandleError):
        s.push(1)
    assert "closed" in repr(s)


def test_reads_from_many_threads(rss):
    errors = []

    def worker():
        try:
            for _ in range(200):
                assert rss.read().used > 0
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_errors_are_per_thread(rss):
    """A failure on one thread does not leak its message into another's."""
    gone = Source.pushed("x")
    gone.close()
    seen = {}

    def fail():
        try:
            gone.read()
        except memprobe.InvalidHandleError as e:
            seen["msg"] = e.message

    t = threading.Thread(target=fail)
    t.start()
    t.join()
    assert "memprobe_source" in seen["msg"]
    rss.read()
    assert memprobe._ffi.last_error() == ""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_child_after_fork_can_read(rss):
    w = memprobe.Window(rss)
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            with Source.process() as mine:
                code = 0 if mine.read().used > 0 and w.peak() > 0 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    w.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
