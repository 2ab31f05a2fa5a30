"""JAX: sampled sources over each device's ``bytes_in_use``.

``jax.Device.memory_stats()`` returns the device allocator's counters,
among them ``bytes_in_use`` and ``peak_bytes_in_use``, but JAX offers no way
to reset that peak (there is no counterpart of
``torch.cuda.reset_peak_memory_stats``): ``peak_bytes_in_use`` is the peak
since the process started, useless for a per-step or per-epoch window. So
memprobe cannot make an exact, resettable mark of it (as it does for
PyTorch's allocator, :mod:`memprobe.integrations.torch`): :func:`jax_sources`
gives *sampled* callback sources over ``bytes_in_use`` instead, polled by
memprobe's monitor while a window is open (fidelity ``SAMPLED``: a spike
shorter than the monitor's interval, 10 ms by default, can be missed; see
``memprobe.monitor.set_interval``). For exact GPU peaks under JAX use
:meth:`memprobe.Source.gpu_exact` (the driver-API interposer counts every
allocation, XLA's included).

jax is imported when :func:`jax_sources` is called, never at
``import memprobe``.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional

from ..sources import Source


def _jax() -> Any:
    try:
        import jax
    except ImportError as e:
        raise ImportError("memprobe.integrations.jax needs JAX: pip install jax") from e
    return jax


def jax_sources(devices: Optional[Iterable[Any]] = None) -> List[Source]:
    """One sampled source per device (default: ``jax.local_devices()``),
    named ``jax:<platform><id>`` (e.g. ``jax:gpu0``), reading
    ``device.memory_stats()["bytes_in_use"]``. A device without memory
    statistics (``memory_stats()`` returning None, e.g. a CPU device) is a
    ValueError here rather than a failing source later."""
    devs = list(_jax().local_devices() if devices is None else devices)
    out: List[Source] = []
    for dev in devs:
        stats = dev.memory_stats()
        if not stats or "bytes_in_use" not in stats:
            raise ValueError(f"JAX device {dev} has no memory statistics (bytes_in_use)")

        def read(dev: Any = dev) -> int:
            return int(dev.memory_stats()["bytes_in_use"])

        out.append(Source.callback(f"jax:{dev.platform}{dev.id}", read))
    return out


__all__ = ["jax_sources"]
