"""The Prometheus exporter: an HTTP endpoint serving ``GET /metrics`` in the
Prometheus text format from the training process itself — its sources'
readings, the last ended phases of the trackers it watches, and optionally
the GPUs as DCGM exporter's gauges (``docs/metrics.md``)::

    with memprobe.Exporter("0.0.0.0:9464") as exporter:   # None: 127.0.0.1, a free port
        exporter.watch(tracker)                            # its sources + ended phases
        exporter.add_gpus()
        train()

To be scraped from other machines, serve it behind TLS and a password with
a web configuration file in Prometheus exporter-toolkit's format (the one
node_exporter's ``--web.config.file`` takes)::

    memprobe.Exporter("0.0.0.0:9464", web_config="/etc/memprobe/web.yml")

The file is re-read when it changes; a bad new file keeps the last good one
and :attr:`Exporter.web_config_error` says why (nothing is printed).

Rank labels come from ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` (torchrun
sets them) or :meth:`Exporter.set_rank`. Scrapes are answered by the
exporter's own threads; the training thread never waits on them.
"""

from __future__ import annotations

import os
from ctypes import byref, c_uint16
from typing import Optional, Union

from . import _ffi
from ._ffi import C, check
from .errors import MemprobeError
from ._owned import Owned
from .sources import Source
from .tracker import Tracker


class Exporter(Owned):
    """Serves ``/metrics`` on ``listen`` (``"IP:PORT"``; None: 127.0.0.1 on
    a free port), with TLS and basic auth as the web configuration file
    ``web_config`` says (``docs/metrics.md``; a file that cannot be read or
    has an unknown key raises, never serves plain HTTP instead). Close it
    (or ``with``) to stop serving and release it."""

    _FREE = "memprobe_exporter_free"

    def __init__(
        self,
        listen: Optional[str] = None,
        web_config: Optional[Union[str, "os.PathLike[str]"]] = None,
    ):
        self._closed = True
        h = _ffi.out_handle()
        addr = None if listen is None else str(listen).encode()
        if web_config is None:
            check(C.memprobe_exporter_start(addr, byref(h)))
        else:
            path = os.fsencode(web_config)
            check(C.memprobe_exporter_start_with_web_config(addr, path, byref(h)))
        self._handle = h.value
        self._closed = False

    @property
    def port(self) -> int:
        """The port it listens on (also after :meth:`stop`)."""
        out = c_uint16()
        check(C.memprobe_exporter_port(self._handle, byref(out)))
        return int(out.value)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>/metrics`` (for a local scrape; an
        exporter whose web configuration has ``tls_server_config`` is
        ``https://`` at the same place)."""
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def web_config_error(self) -> Optional[MemprobeError]:
        """Why the last re-read of the web configuration was refused (an
        exception instance, not raised: the last good configuration is still
        served); None when the last read was good, or without a web
        configuration."""
        return _ffi.stored_error(lambda err, buf, size, needed: int(C.memprobe_exporter_get_web_config_error(self._handle, err, buf, size, needed)))

    def add_source(self, source: Source) -> None:
        """Exports the source's readings, read at each scrape (the exporter
        keeps its own reference)."""
        check(C.memprobe_exporter_add_source(self._handle, source._handle))

    def watch(self, tracker: Tracker) -> None:
        """Exports the tracker's sources and the records of its ended steps,
        epochs, experiences and streams, its releases and leak flags."""
        check(C.memprobe_exporter_watch_tracker(self._handle, tracker._handle))

    def set_rank(self, rank: int = -1, local_rank: int = -1, world_size: int = -1) -> None:
        """Sets the rank labels; a negative value leaves that label out."""
        check(C.memprobe_exporter_set_rank(self._handle, int(rank), int(local_rank), int(world_size)))

    def add_gpus(self, with_processes: bool = False) -> None:
        """Exports the GPUs as ``DCGM_FI_DEV_FB_USED`` / ``_FREE`` / ``_TOTAL``
        (MiB), and each process's memory on them when ``with_processes``."""
        check(C.memprobe_exporter_add_gpus(self._handle, 1 if with_processes else 0))

    def stop(self) -> None:
        """Stops serving and frees the port (:class:`~memprobe.WrongOrderError`
        when already stopped)."""
        check(C.memprobe_exporter_stop(self._handle))


    def __repr__(self) -> str:
        if self._closed:
            return "<memprobe.Exporter (closed)>"
        return f"<memprobe.Exporter {self.url}>"

