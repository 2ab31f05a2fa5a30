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


# bcrypt (cost 4) of "s3cret"; the header is base64 of "user:s3cret".
HASH = "$2b$04$DLse4tY1yMwulgkiUjPoOuY7.3QEz2D0lKkl1cubv8IH8v4FRjdf2"
GOOD = {"Authorization": "Basic dXNlcjpzM2NyZXQ="}


def get(exporter: Exporter, headers: dict) -> int:
    req = urllib.request.Request(exporter.url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_web_config_asks_the_password_and_reports_a_refused_reload(tmp_path):
    import time

    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  user: '{HASH}'\n")
    with Exporter(web_config=web) as e:
        assert get(e, {}) == 401
        assert get(e, {"Authorization": "Basic dXNlcjp3cm9uZw=="}) == 401
        assert get(e, GOOD) == 200
        assert e.web_config_error is None
        # A broken file while serving: refused, said here, the last good one kept.
        tmp = tmp_path / "web.tmp"
        tmp.write_text(f"basic_auth_users:\n  user: '{HASH}'\nbasic_auth_userz: {{}}\n")
        tmp.replace(web)
        deadline = time.monotonic() + 10
        while e.web_config_error is None:
            assert time.monotonic() < deadline, "the broken file was not noticed"
            time.sleep(0.05)
        err = e.web_config_error
        assert isinstance(err, memprobe.ParseError) and "basic_auth_userz" in str(err)
        assert get(e, GOOD) == 200 and get(e, {}) == 401


def test_web_config_errors_fail_the_start(tmp_path):
    with pytest.raises(memprobe.UnavailableError, match="absent.yml"):
        Exporter(web_config=tmp_path / "absent.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("tls_server_config:\n  cert_flie: x\n")
    with pytest.raises(memprobe.ParseError, match="cert_flie"):
        Exporter(web_config=str(bad))
