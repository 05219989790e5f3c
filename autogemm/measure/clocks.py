"""The SM clock and the board's power while something runs, read from NVML (nvidia-ml-py, NVIDIA's own
bindings of the driver's libnvidia-ml): sustained timings record what regime they were measured in (an
H200 at its 700 W limit runs BF16 8192^3 at lower clocks than a short burst does, and a kernel's lead
over cuBLAS can grow there).

`ClockMonitor` samples in a background thread. Where NVML cannot be had (the package missing, a driver
without it, a GPU it does not list), it samples nothing and says so once in the log: the timing itself
does not depend on it.
"""

from __future__ import annotations

import logging
import statistics
import threading
from typing import Any

log: logging.Logger = logging.getLogger(__name__)
SAMPLE_S = 0.02  # between readings
_warned = False


def _nvml_handle(pci_bus_id: str) -> tuple[Any, Any] | None:
    """(pynvml, the device's handle) for the GPU at `pci_bus_id`, or None where NVML cannot say."""
    global _warned
    try:
        import pynvml  # (lazy: nvidia-ml-py)

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
    except Exception as exc:  # (ImportError, NVMLError of any kind: no clocks recorded, nothing else changes)
        if not _warned:
            log.info("autogemm: no SM clock or power readings (NVML: %s: %s)", type(exc).__name__, exc)
            _warned = True
        return None


class ClockMonitor:
    """`with ClockMonitor() as monitor: ...` samples the SM clock (MHz) and power (W) of the GPU at
    `pci_bus_id` (CuPy's current device where None) every SAMPLE_S while the block runs; `figures()`
    gives their medians afterwards ({} where NVML gave none)."""

    def __init__(self, pci_bus_id: str | None = None):
        if pci_bus_id is None:
            import cupy  # (lazy: CuPy)

            pci_bus_id = cupy.cuda.Device().pci_bus_id
        self.pci_bus_id = pci_bus_id
        self.clocks_mhz: list[float] = []
        self.power_w: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None

    def __enter__(self) -> ClockMonitor:
        found = _nvml_handle(self.pci_bus_id)
        self._nvml = found[0] if found is not None else None
        if found is not None:
            self._thread = threading.Thread(target=self._sample, args=found, name="autogemm-clocks", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()  # (NVML counts its initializations: this one's)
            except Exception:
                pass

    def _sample(self, pynvml: Any, handle: Any) -> None:
        try:
            while not self._stop.is_set():
                self.clocks_mhz.append(float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)))
                self.power_w.append(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
                self._stop.wait(SAMPLE_S)
        except Exception as exc:  # (a reading NVML refuses midway: the samples so far stand)
            log.info("autogemm: SM clock readings stopped (NVML: %s: %s)", type(exc).__name__, exc)

    def figures(self) -> dict[str, float]:
        """{"sm_clock_mhz", "power_w"}: the medians of the readings; {} where there were none."""
        if not self.clocks_mhz:
            return {}
        return {"sm_clock_mhz": statistics.median(self.clocks_mhz), "power_w": round(statistics.median(self.power_w), 1)}
