"""The C ABI of libmemprobe as ctypes declarations (include/memprobe.h).

Every C function the package calls is declared in ``PROTOTYPES``; a test
checks that every function of the header is declared here (or listed in
``bindings/python/UNBOUND.txt`` with a reason). The rest of the package
calls them through ``C.<name>`` and :func:`check`.

The constants and structures below (and the status and enum values in
errors.py, sources.py, tracker.py and gpu.py) are copies of the header's:
tests/test_header_contract.py compiles the header and fails on any
difference in a value, a field's name, order, offset or size.
"""

from __future__ import annotations

import ctypes
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_int32,
    c_int64,
    c_size_t,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _loader
from .errors import MemprobeError, Status, error_for

lib, LIBRARY_PATH, FOUND_BY = _loader.load()

# --- constants (#define in memprobe.h) --------------------------------------

MEMPROBE_MONITOR_MIN_INTERVAL_NS = 100_000
MEMPROBE_MONITOR_MAX_INTERVAL_NS = 3_600_000_000_000
MEMPROBE_SAMPLE_TOTAL = 1
MEMPROBE_SAMPLE_FREE = 2
MEMPROBE_SAMPLE_LIMIT = 4
MEMPROBE_SAMPLE_RESERVED = 8
MEMPROBE_PROCESS_PRESERVE_HWM = 1
MEMPROBE_SMAPS_PSS = 0
MEMPROBE_SMAPS_USS = 1
MEMPROBE_TRACE_SILENT = 1
MEMPROBE_TRACE_DEFERRED = 2
MEMPROBE_RELEASE_CACHE = 0
MEMPROBE_RELEASE_GC = 1
MEMPROBE_STEP_DONE = 0
MEMPROBE_STEP_OUT_OF_MEMORY = 1
MEMPROBE_GPU_CURRENT_DEVICE = -1
MEMPROBE_GPU_NO_DEVICE = -1
MEMPROBE_GPU_MEMORY_READ = 1
MEMPROBE_GPU_MEMORY_RESERVED = 2
MEMPROBE_GPU_INFO_NAME = 1
MEMPROBE_GPU_INFO_UUID = 2
MEMPROBE_GPU_INFO_PCI_BUS_ID = 4
MEMPROBE_GPU_INFO_NVML_INDEX = 8
MEMPROBE_OOM_TRIGGER_DRIVER = 1
MEMPROBE_OOM_TRIGGER_CALLER = 2
MEMPROBE_OOM_KEEP_ENDED_DEFAULT = 8
MEMPROBE_OOM_KEEP_ENDED_MAX = 4096
MEMPROBE_OOM_DEVICE_UNKNOWN = -1
MEMPROBE_OOM_EVENT_DEVICE_TOTAL = 1
MEMPROBE_OOM_EVENT_DEVICE_FREE = 2
MEMPROBE_OOM_CACHE_RESERVED = 1
MEMPROBE_OOM_CACHE_ALLOCATED = 2
MEMPROBE_OOM_CACHE_RELEASABLE = 4
MEMPROBE_GPU_ORIGINS_HOST_PINNED = -1
MEMPROBE_GPU_ORIGINS_NO_OOM = -2

# --- types --------------------------------------------------------------------

status_t = c_uint32
handle_t = c_void_p  # memprobe_source*, memprobe_window*, memprobe_trace*: opaque tokens


class memprobe_monitor_stats(Structure):
    _fields_ = [
        ("running", c_bool),
        ("watched", c_uint64),
        ("ticks", c_uint64),
        ("reads", c_uint64),
        ("errors", c_uint64),
        ("interval_ns", c_uint64),
    ]


class memprobe_sample(Structure):
    _fields_ = [
        ("used", c_uint64),
        ("total", c_uint64),
        ("free", c_uint64),
        ("limit", c_uint64),
        ("reserved", c_uint64),
        ("valid", c_uint32),
        ("taken_at_ns", c_uint64),
        ("read_ns", c_uint64),
    ]


class memprobe_source_info(Structure):
    _fields_ = [("kind", c_uint32), ("fidelity", c_uint32), ("name", c_char * 72)]


class memprobe_delta(Structure):
    _fields_ = [
        ("used_start", c_uint64),
        ("used_end", c_uint64),
        ("peak", c_uint64),
        ("delta_used", c_int64),
        ("delta_peaked", c_uint64),
        ("kind", c_uint32),
        ("fidelity", c_uint32),
    ]


class memprobe_gpu_info(Structure):
    _fields_ = [
        ("id", c_uint32),
        ("backend", c_uint32),
        ("nvml_index", c_uint32),
        ("valid", c_uint32),
        ("name", c_char * 96),
        ("uuid", c_char * 96),
        ("pci_bus_id", c_char * 32),
    ]


class memprobe_gpu_memory(Structure):
    _fields_ = [
        ("total", c_uint64),
        ("free", c_uint64),
        ("used", c_uint64),
        ("reserved", c_uint64),
        ("valid", c_uint32),
        ("taken_at_ns", c_uint64),
        ("read_ns", c_uint64),
    ]


class memprobe_gpu_origin(Structure):
    _fields_ = [
        ("id", c_uint32),
        ("has_symbol", c_uint32),
        ("bytes", c_uint64),
        ("address", c_uint64),
        ("offset", c_uint64),
        ("library", c_char * 200),
        ("symbol", c_char * 104),
        ("is_program", c_uint32),
    ]


class memprobe_phase_record(Structure):
    _fields_ = [
        ("kind", c_uint32),
        ("depth", c_uint32),
        ("index", c_uint64),
        ("started_at_ns", c_uint64),
        ("ended_at_ns", c_uint64),
        ("duration_ns", c_uint64),
        ("n_sources", c_uint32),
        ("n_releases", c_uint32),
        ("leak_flags", c_uint64),
        ("released_bytes", c_uint64),
        ("name", c_char * 72),
    ]


class memprobe_oom_retry_result(Structure):
    _fields_ = [("succeeded", c_bool), ("retries", c_uint32), ("freed_bytes", c_uint64)]


#: void (*)(const char *json, const char *summary, void *user_data)
memprobe_oom_report_fn = CFUNCTYPE(None, c_char_p, c_char_p, c_void_p)


class memprobe_oom_report_options(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("triggers", c_uint32),
        ("path", c_char_p),
        ("json_fd", c_int32),
        ("summary_fd", c_int32),
        ("callback", memprobe_oom_report_fn),
        ("user_data", c_void_p),
        ("keep_ended", c_uint32),
    ]


class memprobe_oom_report_cache(Structure):
    _fields_ = [
        ("device", c_uint32),
        ("valid", c_uint32),
        ("reserved_bytes", c_uint64),
        ("allocated_bytes", c_uint64),
        ("releasable_bytes", c_uint64),
    ]


class memprobe_oom_report_event(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("device", c_int32),
        ("requested_bytes", c_uint64),
        ("reported_by", c_char_p),
        ("detail", c_char_p),
        ("valid", c_uint32),
        ("n_caches", c_uint32),
        ("device_total_bytes", c_uint64),
        ("device_free_bytes", c_uint64),
        ("caches", POINTER(memprobe_oom_report_cache)),
        ("live_blocks_json", c_char_p),
    ]


class memprobe_oom_report_status(Structure):
    _fields_ = [
        ("armed", c_bool),
        ("triggers", c_uint32),
        ("reports_written", c_uint64),
        ("triggers_seen", c_uint64),
        ("later_triggers", c_uint64),
        ("last_write_status", c_uint32),
    ]


#: void (*)(const memprobe_phase_record *, const memprobe_delta *, size_t, void *)
memprobe_record_fn = CFUNCTYPE(
    None, POINTER(memprobe_phase_record), POINTER(memprobe_delta), c_size_t, c_void_p
)
#: int32_t (*)(void *user_data)
memprobe_release_fn = CFUNCTYPE(c_int32, c_void_p)
#: int32_t (*)(void *user_data)
memprobe_step_fn = CFUNCTYPE(c_int32, c_void_p)
#: int32_t (*)(void *user_data, uint64_t *out_bytes)
memprobe_read_fn = CFUNCTYPE(c_int32, c_void_p, POINTER(c_uint64))
#: void (*)(const char *line, void *user_data)
memprobe_line_fn = CFUNCTYPE(None, c_char_p, c_void_p)
#: int32_t (*)(void *user_data, size_t index, uint64_t *out_bytes)
memprobe_mark_read_fn = CFUNCTYPE(c_int32, c_void_p, c_size_t, POINTER(c_uint64))
#: int32_t (*)(void *user_data)
memprobe_mark_reset_fn = CFUNCTYPE(c_int32, c_void_p)
#: int32_t (*)(void *user_data, uint32_t what, const size_t *indices, size_t count, uint64_t *out_bytes)
memprobe_mark_read_many_fn = CFUNCTYPE(c_int32, c_void_p, c_uint32, POINTER(c_size_t), c_size_t, POINTER(c_uint64))

P = POINTER
PROTOTYPES: Dict[str, Tuple[Any, List[Any]]] = {
    # library
    "memprobe_version": (c_char_p, []),
    "memprobe_soname": (c_char_p, []),
    "memprobe_b2mb": (c_uint64, [c_uint64]),
    "memprobe_b2mb_signed": (c_int64, [c_int64]),
    "memprobe_debug_live_handles": (
        status_t,
        [P(c_uint64), P(c_uint64), P(c_uint64), P(c_uint64)],
    ),
    "memprobe_last_error": (c_char_p, []),
    "memprobe_status_name": (c_char_p, [c_uint32]),
    # monitor
    "memprobe_monitor_set_interval_ns": (status_t, [c_uint64]),
    "memprobe_monitor_get_stats": (status_t, [P(memprobe_monitor_stats)]),
    "memprobe_monitor_stop": (status_t, []),
    # sources
    "memprobe_source_new_process": (status_t, [c_uint32, P(handle_t)]),
    "memprobe_source_new_process_tree": (status_t, [P(handle_t)]),
    "memprobe_source_new_system_ram": (status_t, [P(handle_t)]),
    "memprobe_source_new_cgroup": (status_t, [P(handle_t)]),
    "memprobe_source_new_smaps": (status_t, [c_uint32, P(handle_t)]),
    "memprobe_source_new_process_tree_smaps": (status_t, [c_uint32, P(handle_t)]),
    "memprobe_source_new_pushed": (status_t, [c_char_p, P(handle_t)]),
    "memprobe_source_new_callback": (
        status_t,
        [c_char_p, memprobe_read_fn, c_void_p, P(handle_t)],
    ),
    "memprobe_source_free": (status_t, [handle_t]),
    "memprobe_source_read": (status_t, [handle_t, P(memprobe_sample)]),
    "memprobe_source_read_used": (status_t, [handle_t, P(c_uint64)]),
    "memprobe_source_push": (status_t, [handle_t, c_uint64]),
    "memprobe_source_get_info": (status_t, [handle_t, P(memprobe_source_info)]),
    "memprobe_source_get_last_error": (
        status_t,
        [handle_t, P(status_t), c_char_p, c_size_t, P(c_size_t)],
    ),
    "memprobe_source_new_gpu_device": (status_t, [c_uint32, P(handle_t)]),
    "memprobe_source_new_gpu_process": (status_t, [c_uint32, P(handle_t)]),
    "memprobe_source_new_gpu_exact": (status_t, [c_uint32, P(handle_t)]),
    # marks kept by the caller (memprobe.marks)
    "memprobe_mark_group_new": (
        status_t,
        [memprobe_mark_read_fn, memprobe_mark_read_fn, memprobe_mark_reset_fn, c_void_p, P(handle_t)],
    ),
    "memprobe_mark_group_new_many": (
        status_t,
        [memprobe_mark_read_many_fn, memprobe_mark_reset_fn, c_void_p, P(handle_t)],
    ),
    "memprobe_mark_group_free": (status_t, [handle_t]),
    "memprobe_source_new_mark": (status_t, [handle_t, c_size_t, c_char_p, P(handle_t)]),
    # GPUs
    "memprobe_gpu_configure": (status_t, [c_uint32, c_char_p, c_char_p]),
    "memprobe_gpu_get_backend": (status_t, [P(c_uint32)]),
    "memprobe_gpu_count": (status_t, [P(c_uint32)]),
    "memprobe_gpu_get_info": (status_t, [c_uint32, P(memprobe_gpu_info)]),
    "memprobe_gpu_mem_get": (status_t, [c_int64, P(memprobe_gpu_memory)]),
    "memprobe_gpu_mem_get_all": (status_t, [P(memprobe_gpu_memory), c_size_t, P(c_size_t)]),
    "memprobe_gpu_origins_live": (status_t, [c_int32, P(memprobe_gpu_origin), c_size_t, P(c_size_t)]),
    "memprobe_gpu_origins_at_peak": (
        status_t,
        [c_int32, P(memprobe_gpu_origin), c_size_t, P(c_size_t), P(c_uint64), P(c_uint64)],
    ),
    "memprobe_gpu_origins_at_oom": (
        status_t,
        [P(memprobe_gpu_origin), c_size_t, P(c_size_t), P(c_int32), P(c_uint64), P(c_uint64)],
    ),
    "memprobe_gpu_mem_get_free": (status_t, [P(c_uint64)]),
    "memprobe_gpu_mem_get_used": (status_t, [P(c_uint64)]),
    "memprobe_gpu_mem_get_free_no_cache": (status_t, [P(c_uint64)]),
    "memprobe_gpu_mem_get_used_no_cache": (status_t, [P(c_uint64)]),
    "memprobe_gpu_with_max_free_mem": (status_t, [P(c_int64), P(c_uint64)]),
    "memprobe_gpu_get_current_device": (status_t, [P(c_uint32)]),
    "memprobe_gpu_set_current_device": (status_t, [c_uint32]),
    "memprobe_gpu_preload": (status_t, []),
    "memprobe_gpu_set_cache_release": (status_t, [memprobe_release_fn, c_void_p]),
    "memprobe_gpu_device_open": (status_t, [c_uint32, P(handle_t)]),
    "memprobe_gpu_mem_get_used_fast": (status_t, [handle_t, P(c_uint64)]),
    "memprobe_gpu_device_mem_get": (status_t, [handle_t, P(memprobe_gpu_memory)]),
    "memprobe_gpu_device_process_used": (status_t, [handle_t, P(c_uint64)]),
    "memprobe_gpu_device_free": (status_t, [handle_t]),
    "memprobe_gpu_debug_live_devices": (status_t, [P(c_uint64)]),
    # traces
    "memprobe_trace_new": (
        status_t,
        [P(handle_t), c_size_t, c_char_p, c_uint32, P(handle_t)],
    ),
    "memprobe_trace_start": (status_t, [handle_t]),
    "memprobe_trace_stop": (status_t, [handle_t]),
    "memprobe_trace_reset": (status_t, [handle_t]),
    "memprobe_trace_is_running": (status_t, [handle_t, P(c_bool)]),
    "memprobe_trace_data": (status_t, [handle_t, c_size_t, P(c_int64), P(c_uint64)]),
    "memprobe_trace_measure": (status_t, [handle_t, c_size_t, P(memprobe_delta)]),
    "memprobe_trace_report": (status_t, [handle_t, c_char_p]),
    "memprobe_trace_report_n_reset": (status_t, [handle_t, c_char_p]),
    "memprobe_trace_format": (
        status_t,
        [handle_t, c_char_p, c_char_p, c_size_t, P(c_size_t)],
    ),
    "memprobe_trace_set_silent": (status_t, [handle_t, c_bool]),
    "memprobe_trace_set_output_fd": (status_t, [handle_t, c_int32]),
    "memprobe_trace_set_output_callback": (status_t, [handle_t, memprobe_line_fn, c_void_p]),
    "memprobe_trace_free": (status_t, [handle_t]),
    # the Prometheus exporter
    "memprobe_exporter_start": (status_t, [c_char_p, P(handle_t)]),
    "memprobe_exporter_start_with_web_config": (status_t, [c_char_p, c_char_p, P(handle_t)]),
    "memprobe_exporter_get_web_config_error": (
        status_t,
        [handle_t, P(status_t), c_char_p, c_size_t, P(c_size_t)],
    ),
    "memprobe_exporter_port": (status_t, [handle_t, P(c_uint16)]),
    "memprobe_exporter_add_source": (status_t, [handle_t, handle_t]),
    "memprobe_exporter_watch_tracker": (status_t, [handle_t, handle_t]),
    "memprobe_exporter_set_rank": (status_t, [handle_t, c_int64, c_int64, c_int64]),
    "memprobe_exporter_add_gpus": (status_t, [handle_t, c_int32]),
    "memprobe_exporter_stop": (status_t, [handle_t]),
    "memprobe_exporter_free": (status_t, [handle_t]),
    # windows
    "memprobe_window_open": (status_t, [P(handle_t), c_size_t, P(handle_t)]),
    "memprobe_window_peak": (status_t, [handle_t, c_size_t, P(c_uint64)]),
    "memprobe_window_measure": (status_t, [handle_t, c_size_t, P(memprobe_delta)]),
    "memprobe_window_reset": (status_t, [handle_t, P(memprobe_delta), c_size_t]),
    "memprobe_window_source_count": (status_t, [handle_t, P(c_size_t)]),
    "memprobe_window_free": (status_t, [handle_t]),
    # trackers
    "memprobe_tracker_new": (status_t, [P(handle_t), c_size_t, P(handle_t)]),
    "memprobe_tracker_free": (status_t, [handle_t]),
    "memprobe_tracker_begin": (status_t, [handle_t, c_uint32, c_char_p]),
    "memprobe_tracker_end": (
        status_t,
        [handle_t, c_uint32, c_char_p, P(memprobe_phase_record), P(memprobe_delta), c_size_t],
    ),
    "memprobe_tracker_next": (
        status_t,
        [handle_t, c_uint32, c_char_p, P(memprobe_phase_record), P(memprobe_delta), c_size_t],
    ),
    "memprobe_tracker_end_into": (
        status_t,
        [handle_t, c_uint32, c_char_p, c_uint32, c_char_p, P(memprobe_phase_record), P(memprobe_delta), c_size_t],
    ),
    "memprobe_tracker_end_tail": (
        status_t,
        [handle_t, c_uint32, c_char_p, c_uint32, c_char_p, P(memprobe_phase_record), P(memprobe_delta), c_size_t],
    ),
    "memprobe_tracker_resume": (status_t, [handle_t, c_uint32, c_char_p, c_uint32, c_char_p]),
    "memprobe_tracker_mark_tail": (status_t, [handle_t, c_uint32, c_char_p]),
    "memprobe_tracker_add_table_sink": (status_t, [handle_t, c_uint32, c_int32]),
    "memprobe_tracker_add_jsonl_sink": (status_t, [handle_t, c_char_p]),
    "memprobe_tracker_add_csv_sink": (status_t, [handle_t, c_char_p]),
    "memprobe_tracker_add_callback_sink": (status_t, [handle_t, memprobe_record_fn, c_void_p]),
    "memprobe_tracker_finish_sinks": (status_t, [handle_t]),
    "memprobe_tracker_add_release": (
        status_t,
        [handle_t, c_char_p, c_uint32, memprobe_release_fn, c_void_p],
    ),
    "memprobe_tracker_release_every": (status_t, [handle_t, c_uint32, c_uint64, c_bool]),
    "memprobe_tracker_release_below_free": (status_t, [handle_t, c_size_t, c_uint64, c_bool]),
    "memprobe_tracker_release_now": (status_t, [handle_t, c_bool, P(c_uint64), c_size_t]),
    "memprobe_tracker_releases_fired": (status_t, [handle_t, P(c_uint64)]),
    "memprobe_tracker_set_leak_policy": (status_t, [handle_t, c_uint64, c_uint32]),
    "memprobe_tracker_leak_status": (
        status_t,
        [handle_t, c_size_t, P(c_bool), P(c_uint32), P(c_int64)],
    ),
    "memprobe_tracker_set_oom_report": (status_t, [handle_t, P(memprobe_oom_report_options)]),
    "memprobe_tracker_report_oom": (status_t, [handle_t, c_int32, c_uint64, c_char_p]),
    "memprobe_tracker_report_oom_event": (status_t, [handle_t, P(memprobe_oom_report_event)]),
    "memprobe_tracker_oom_status": (status_t, [handle_t, P(memprobe_oom_report_status)]),
    "memprobe_tracker_rearm_oom_report": (status_t, [handle_t]),
    "memprobe_tracker_run_oom_retry": (
        status_t,
        [
            handle_t,
            memprobe_step_fn,
            c_void_p,
            c_uint32,
            P(memprobe_oom_retry_result),
            P(c_uint64),
            c_size_t,
        ],
    ),
}


def _missing(name: str) -> Callable[..., int]:
    def call(*_args: Any) -> int:
        raise MemprobeError(
            Status.UNSUPPORTED,
            f"{name} is not in {LIBRARY_PATH} (library {version()}); "
            "this package was written for a newer library",
        )

    call.__name__ = name
    return call


def _bind() -> SimpleNamespace:
    ns = SimpleNamespace()
    for name, (restype, argtypes) in PROTOTYPES.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            setattr(ns, name, _missing(name))
            continue
        f.restype = restype
        f.argtypes = argtypes
        setattr(ns, name, f)
    return ns


#: The declared C functions: ``C.memprobe_source_read(h, byref(sample))``.
C = _bind()


def version() -> str:
    """The library's version, e.g. ``"0.1.0"``."""
    return str(C.memprobe_version().decode())


def last_error() -> str:
    """``memprobe_last_error()``: why the last call on this thread failed."""
    return str(C.memprobe_last_error().decode("utf-8", "replace"))


def check(status: int) -> None:
    """Raises the :class:`MemprobeError` subclass for a failed call.

    Must run on the thread that made the call, right after it (the message
    is thread-local and cleared by the next call)."""
    if status != Status.OK:
        raise error_for(status, last_error())


def stored_error(get: Callable[[Any, Any, int, Any], int]) -> Optional[MemprobeError]:
    """An error the library keeps (a status and its message), read through
    ``get(status_out, buf, size, needed_out)`` with the buffer grown as the
    library asks: the exception instance, not raised; ``None`` for OK."""
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        err, needed = ctypes.c_uint32(), ctypes.c_size_t()
        status = get(ctypes.byref(err), buf, size, ctypes.byref(needed))
        if status == Status.BUFFER_TOO_SMALL and needed.value > size:
            size = int(needed.value)
            continue
        check(status)
        if err.value == Status.OK:
            return None
        return error_for(err.value, buf.value.decode("utf-8", "replace"))


def status_name(status: int) -> str:
    """``memprobe_status_name``: ``"ok"``, ``"null pointer"``, ..."""
    return str(C.memprobe_status_name(int(status)).decode())


def handles(objs: Any) -> Tuple[Any, int]:
    """A C array of the handles of ``objs`` (objects with ``_handle``)."""
    objs = list(objs)
    arr = (handle_t * len(objs))(*[o._handle for o in objs])
    return arr, len(objs)


def out_handle() -> c_void_p:
    return c_void_p()


byref = ctypes.byref
