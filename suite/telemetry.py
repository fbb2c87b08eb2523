"""NVML telemetry during a case: a background thread samples SM/memory clocks, power, temperature, throttle
reasons and the energy counter; summary() condenses them. Without NVML it records nothing and never raises.
"""
from __future__ import annotations

import math
import threading
from typing import Any

# Clock-event reasons that mean "clocks held down by a limit". GpuIdle, ApplicationsClocksSetting,
# DisplayClockSetting and SyncBoost are left out: they flip with idle gaps or settings, not with load,
# and would make every compare "ambiguous".
THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}
SUMMARY_KEYS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "throttle", "energy_j", "n_samples")


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


class _Nvml:
    """One device's NVML handle; read() returns one sample dict, fields NaN where NVML says unsupported."""

    def __init__(self, device_index: int):
        import pynvml
        self.nv = pynvml
        pynvml.nvmlInit()
        try:
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:
            pynvml.nvmlShutdown()
            raise
        self._reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def _get(self, fn, *args) -> float:
        try:
            return float(fn(self.handle, *args))
        except self.nv.NVMLError:
            return math.nan

    def read(self) -> dict[str, float]:
        nv = self.nv
        return {
            "sm_clock_mhz": self._get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": self._get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
            "power_w": self._get(nv.nvmlDeviceGetPowerUsage) / 1000.0,              # mW -> W
            "temp_c": self._get(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
            "energy_j": self._get(nv.nvmlDeviceGetTotalEnergyConsumption) / 1000.0,  # mJ since driver load
            "reasons": self._get(self._reasons),
        }

    def close(self) -> None:
        self.nv.nvmlShutdown()


def _open_nvml(device_index: int) -> _Nvml:
    return _Nvml(device_index)


class Sampler:
    """`with Sampler(0) as s: run_case()` then `s.summary()`. One sample at enter and exit plus one every
    interval_s in between, so even a case shorter than the interval gets two readings."""

    def __init__(self, device_index: int = 0, interval_s: float = 0.05):
        self.device_index = device_index
        self.interval_s = interval_s
        self.samples: list[dict[str, float]] = []
        self.reason = ""
        self._source = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Sampler":
        try:
            self._source = _open_nvml(self.device_index)
        except Exception as exc:   # noqa: BLE001 - no NVML (CPU machine, no driver): record why, go on
            self.reason = f"no NVML telemetry: {type(exc).__name__}: {exc}"
            return self
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="kdbench-telemetry", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> bool:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self._source is not None:
            self._sample()
            try:
                self._source.close()
            except Exception:   # noqa: BLE001 - shutdown failure must not mask the case's own result
                pass
        return False

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._sample():
                return

    def _sample(self) -> bool:
        try:
            self.samples.append(self._source.read())
            return True
        except Exception as exc:   # noqa: BLE001 - a failing read ends sampling, never the case
            self.reason = f"NVML read failed: {type(exc).__name__}: {exc}"
            return False

    def summary(self) -> dict[str, Any]:
        out = summarize(self.samples)
        if self.reason or not self.samples:
            out["reason"] = self.reason or "no samples"
        return out


def summarize(samples: list[dict[str, float]]) -> dict[str, Any]:
    """Median SM/mem clock and power, max temperature, union of throttle reasons, energy counter delta."""
    def col(key):
        return [s[key] for s in samples if not math.isnan(s.get(key, math.nan))]

    def median(key):
        vals = sorted(col(key))
        if not vals:
            return math.nan
        mid = len(vals) // 2
        return vals[mid] if len(vals) % 2 else 0.5 * (vals[mid - 1] + vals[mid])

    energy = col("energy_j")
    names = sorted({n for m in col("reasons") for n in throttle_names(int(m))})
    return {
        "sm_clock_mhz": median("sm_clock_mhz"),
        "mem_clock_mhz": median("mem_clock_mhz"),
        "power_w": median("power_w"),
        "temp_c": max(col("temp_c"), default=math.nan),
        "throttle": ",".join(names),
        # the counter only grows; a smaller last value means a driver reload, so the delta is unknown
        "energy_j": energy[-1] - energy[0] if len(energy) >= 2 and energy[-1] >= energy[0] else math.nan,
        "n_samples": len(samples),
    }
