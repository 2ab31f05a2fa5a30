"""The Prometheus exporter, scraped over HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from conftest import MiB

import memprobe
from memprobe import Exporter, Source, Tracker


def scrape(exporter: Exporter) -> str:
    with urllib.request.urlopen(exporter.url, timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


def test_exports_sources_and_tracker_phases():
    with Source.pushed("alloc") as alloc, Exporter() as e:
        assert e.port > 0 and str(e.port) in repr(e)
        alloc.push(100 * MiB)
        e.add_source(alloc)
        e.set_rank(3, 1, 8)
        with Tracker(alloc) as t:
            e.watch(t)
            with t.epoch():
                with t.step():
                    alloc.push(300 * MiB)
                    alloc.push(120 * MiB)
            text = scrape(e)
        assert 'memprobe_source_used_bytes{' in text and 'source="alloc"' in text
        assert str(120 * MiB) in text
        assert "memprobe_phase_peak_bytes{" in text and 'phase="step"' in text
        assert str(300 * MiB) in text
        assert 'rank="3"' in text and 'world_size="8"' in text
        e.add_gpus(with_processes=True)  # without a GPU the families are absent
        scrape(e)
        e.stop()
        with pytest.raises(memprobe.WrongOrderError):
            e.stop()
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            scrape(e)
        assert e.port > 0
    assert e.closed
    with pytest.raises(memprobe.InvalidHandleError):
        e.port


def test_bad_listen_address():
    with pytest.raises(memprobe.InvalidArgumentError):
        Exporter("not an address")


def test_port_in_use_is_an_io_error():
    with Exporter() as first:
        with pytest.raises(memprobe.IoError) as err:
            Exporter(f"127.0.0.1:{first.port}")
        assert "in use" in err.value.message
