"""NVML polled from native threads, for the GPU validation scripts:
scripts/gpu-validate-nvml-poll.c compiled here and loaded through ctypes.

A Python poller thread needs the GIL between reads, and a training thread
that busy-waits in Python holds it (the switch interval is 5 ms), so a
Python poller misses the spikes it is asked to catch. These pollers never
take the GIL, and hold() busy-waits in C with the GIL released, as a
kernel or a blocking synchronisation would.
"""

import ctypes
import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


class NativeNvml:
    """Pollers of NVML's used bytes of one device (start / take / polls /
    errors / stop through ``lib``) and a busy-wait that releases the GIL."""

    def __init__(self, workdir):
        cc = shutil.which(os.environ.get("CC", "cc"))
        if cc is None:
            raise RuntimeError("no C compiler for the native NVML poller")
        so = os.path.join(workdir, "nvml_poll.so")
        subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", so,
                        os.path.join(HERE, "gpu-validate-nvml-poll.c"), "-ldl", "-lpthread"], check=True)
        lib = ctypes.CDLL(so)
        lib.poller_start.restype = ctypes.c_void_p
        lib.poller_start.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_longlong, ctypes.POINTER(ctypes.c_int)]
        for f in ("poller_take", "poller_polls", "poller_errors", "poller_stop"):
            getattr(lib, f).argtypes = [ctypes.c_void_p]
        lib.poller_take.restype = ctypes.c_ulonglong
        lib.poller_polls.restype = ctypes.c_longlong
        lib.poller_errors.restype = ctypes.c_longlong
        lib.hold_ns.argtypes = [ctypes.c_longlong]
        self.lib = lib

    def start(self, index, interval_s):
        why = ctypes.c_int()
        path = os.environ.get("MEMPROBE_NVML_LIBRARY") or "libnvidia-ml.so.1"
        p = self.lib.poller_start(path.encode(), index, int(interval_s * 1e9), ctypes.byref(why))
        if not p:
            reason = {1: "no NVML library", 2: "nvmlInit_v2 failed", 3: "no such NVML device"}.get(why.value, "?")
            raise RuntimeError(f"NVML poller on {path} device {index}: {reason}")
        return p

    def hold(self, seconds):
        self.lib.hold_ns(int(seconds * 1e9))
