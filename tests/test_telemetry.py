"""Tests of kdbench.telemetry, kdbench.topology and kdbench.envinfo: without NVML everything degrades to NaNs /
empty lists with a reason and never raises; with a fake NVML the summaries, link counts and matrix are right."""
import math
import sys
import time
import types

import pytest

from kdbench import envinfo, telemetry, topology
from kdbench.telemetry import Sampler, summarize, throttle_names


# ------------------------------------------------------------------------------------------ telemetry

def _no_nvml(index):
    raise RuntimeError("NVML Shared Library Not Found")


def test_sampler_without_nvml_returns_nans_and_reason(monkeypatch):
    monkeypatch.setattr(telemetry, "_open_nvml", _no_nvml)
    with Sampler(0, interval_s=0.01) as s:
        time.sleep(0.02)
    out = s.summary()
    assert set(telemetry.SUMMARY_KEYS) <= set(out)
    assert all(math.isnan(out[k]) for k in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "energy_j"))
    assert out["throttle"] == "" and out["n_samples"] == 0
    assert "NVML Shared Library Not Found" in out["reason"]


def test_sampler_on_this_machine_never_raises():
    with Sampler() as s:
        sum(range(1000))
    out = s.summary()
    assert set(telemetry.SUMMARY_KEYS) <= set(out)
    assert out["n_samples"] >= 2 or out["reason"]       # a GPU gives readings, a CPU machine a reason


def test_sampler_does_not_swallow_the_case_exception(monkeypatch):
    monkeypatch.setattr(telemetry, "_open_nvml", _no_nvml)
    with pytest.raises(KeyError):
        with Sampler():
            raise KeyError("the case failed")


class FakeSource:
    """An NVML stand-in: energy grows 10 J per read, clocks drop and power capping appears on read 3."""

    def __init__(self, fail_after: int | None = None):
        self.n, self.fail_after, self.closed = 0, fail_after, False

    def read(self):
        self.n += 1
        if self.fail_after is not None and self.n > self.fail_after:
            raise OSError("GPU fell off the bus")
        capped = self.n >= 3
        return {"sm_clock_mhz": 1500.0 if capped else 1980.0, "mem_clock_mhz": 3201.0, "power_w": 650.0,
                "temp_c": 40.0 + self.n, "energy_j": 1000.0 + 10.0 * self.n,
                "reasons": float(0x4 | 0x1) if capped else float(0x1)}

    def close(self):
        self.closed = True


def test_sampler_thread_collects_and_summarizes(monkeypatch):
    src = FakeSource()
    monkeypatch.setattr(telemetry, "_open_nvml", lambda index: src)
    with Sampler(0, interval_s=0.005) as s:
        time.sleep(0.06)
    out = s.summary()
    assert src.closed and "reason" not in out
    assert out["n_samples"] == src.n >= 4
    assert out["energy_j"] == pytest.approx(10.0 * (src.n - 1))
    assert out["throttle"] == "sw_power_cap"                  # gpu_idle is not a throttle
    assert out["temp_c"] == 40.0 + src.n and out["mem_clock_mhz"] == 3201.0


def test_sampler_read_failure_stops_sampling_with_reason(monkeypatch):
    monkeypatch.setattr(telemetry, "_open_nvml", lambda index: FakeSource(fail_after=2))
    with Sampler(0, interval_s=0.002) as s:
        time.sleep(0.03)
    out = s.summary()
    assert out["n_samples"] == 2 and "GPU fell off the bus" in out["reason"]


def test_summarize_medians_and_energy_reset():
    rows = [{"sm_clock_mhz": c, "energy_j": e, "reasons": 0.0} for c, e in ((1000, 50.0), (2000, 60.0),
                                                                               (1800, 70.0), (math.nan, 80.0))]
    out = summarize(rows)
    assert out["sm_clock_mhz"] == 1800 and out["energy_j"] == 30.0
    assert math.isnan(out["power_w"]) and out["throttle"] == ""
    rows[-1]["energy_j"] = 1.0                                 # counter went backwards: driver reload
    assert math.isnan(summarize(rows)["energy_j"])


def test_throttle_names():
    assert throttle_names(0x1 | 0x2) == []
    assert throttle_names(0x4 | 0x40 | 0x80) == ["sw_power_cap", "hw_thermal_slowdown", "hw_power_brake_slowdown"]


# ------------------------------------------------------------------------------------------ topology

class NVMLError(Exception):
    pass


def fake_pynvml():
    """4 GPUs: 0 and 1 on an NVSwitch fabric (18 links each), 2 and 3 bridged by 4 direct links, the rest
    PCIe across the host (SYS) or one host bridge (PHB)."""
    bus = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:9A:00.0", "00000000:AB:00.0"]
    links = {0: [("switch", None)] * 18, 1: [("switch", None)] * 18,
             2: [("gpu", 3)] * 4, 3: [("gpu", 2)] * 4}
    nv = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_NVLINK_MAX_LINKS=36, NVML_FEATURE_ENABLED=1,
        NVML_NVLINK_DEVICE_TYPE_GPU=0, NVML_NVLINK_DEVICE_TYPE_SWITCH=2,
        NVML_P2P_CAPS_INDEX_NVLINK=3, NVML_P2P_STATUS_OK=0)
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 4
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus[h].encode())

    def link(h, i):
        if i >= len(links[h]):
            raise NVMLError("Not Supported")
        return links[h][i]
    nv.nvmlDeviceGetNvLinkState = lambda h, i: link(h, i) and 1
    nv.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, i: 2 if link(h, i)[0] == "switch" else 0
    switch_bus = "00000000:FF:00.0"          # what NVML reports as the far end of a switch link
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, i: types.SimpleNamespace(
        busId=(switch_bus if link(h, i)[1] is None else bus[link(h, i)[1]])[4:])
    nv.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 30 if {a, b} == {0, 1} else 50
    nv.nvmlDeviceGetP2PStatus = lambda a, b, idx: 0 if {a, b} in ({0, 1}, {2, 3}) else 1
    return nv


def test_gpu_pairs_from_fake_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    pairs = {(p["a"], p["b"]): p for p in topology.gpu_pairs()}
    assert len(pairs) == 6
    assert pairs[(0, 1)]["link"] == "nvlink" and pairs[(0, 1)]["nvlinks"] == 18
    assert "NVSwitch" in pairs[(0, 1)]["detail"]
    assert pairs[(2, 3)]["nvlinks"] == 4 and "direct" in pairs[(2, 3)]["detail"]   # 8-digit vs 4-digit domain
    assert pairs[(0, 2)] == {"a": 0, "b": 2, "link": "pcie", "nvlinks": 0, "pcie": "SYS",
                             "detail": "SYS: across NUMA nodes (SMP interconnect)"}
    text = topology.matrix_text()
    assert text.splitlines()[1].split() == ["GPU0", "X", "NV18", "SYS", "SYS"]
    assert text.splitlines()[3].split() == ["GPU2", "SYS", "SYS", "X", "NV4"]


def test_direct_links_found_without_the_remote_type_query(monkeypatch):
    nv = fake_pynvml()
    nv.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, i: (_ for _ in ()).throw(NVMLError("Not Supported"))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    pairs = {(p["a"], p["b"]): p for p in topology.gpu_pairs()}
    assert pairs[(2, 3)]["nvlinks"] == 4
    assert pairs[(0, 1)]["link"] == "pcie"      # switch links cannot be told apart without the type query


def test_topology_without_nvml_is_empty_with_reason(monkeypatch):
    broken = types.SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(OSError("no driver")))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    pairs = topology.gpu_pairs()
    assert pairs == [] and "no driver" in pairs.reason
    assert topology.matrix_text().startswith("no GPU topology: no NVML")


def test_single_gpu_has_no_pairs(monkeypatch):
    nv = fake_pynvml()
    nv.nvmlDeviceGetCount = lambda: 1
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    pairs = topology.gpu_pairs()
    assert pairs == [] and pairs.reason == "1 GPU(s): no pairs"


# ------------------------------------------------------------------------------------------ envinfo

def test_fingerprint_has_the_keys():
    fp = envinfo.fingerprint()
    for key in ("hostname", "cpu_model", "cpu_cores", "ram_gb", "os", "python", "packages", "torch_cuda",
                "cuda_available", "gpus", "gpu_reason", "git", "topology", "topology_reason", "gpu_slug"):
        assert key in fp, key
    assert set(fp["packages"]) == {"numpy", "torch", "pandas", "jinja2", "matplotlib", "pynvml"}
    assert {"sha", "dirty"} <= set(fp["git"])
    assert fp["cpu_cores"] >= 1 and fp["ram_gb"] > 0
    if not fp["gpus"]:
        assert fp["gpu_slug"] == "cpu" and fp["gpu_reason"] and fp["topology"] == []
    text = envinfo.describe(fp)
    assert fp["hostname"] in text and "slug" in text


def test_fingerprint_records_the_kernel_knobs_that_are_set(monkeypatch):
    """A run with KDB_TVM_SPLITS (or the tail / PDL switches) set times other plans: its fingerprint and the report's
    Environment say so; unset knobs are not listed."""
    from kdbench.report import env_rows
    for k in envinfo.KERNEL_KNOBS:
        monkeypatch.delenv(k, raising=False)
    assert envinfo.fingerprint()["kernel_knobs"] == {}
    monkeypatch.setenv("KDB_TVM_SPLITS", "4")
    fp = envinfo.fingerprint()
    assert fp["kernel_knobs"] == {"KDB_TVM_SPLITS": "4"}
    assert ("kernel knobs", "KDB_TVM_SPLITS=4") in env_rows(fp)
    assert ("kernel knobs", "none set") in env_rows(dict(fp, kernel_knobs={}))


def test_gpu_slug():
    assert envinfo.gpu_slug({"gpus": [{"name": "NVIDIA H200"}]}) == "nvidia-h200"
    assert envinfo.gpu_slug({"gpus": [{"name": "NVIDIA RTX PRO 6000 Blackwell"}]}) == \
        "nvidia-rtx-pro-6000-blackwell"
    assert envinfo.gpu_slug({"gpus": []}) == "cpu"


def test_git_sha_falls_back_to_the_environment_outside_a_checkout(monkeypatch):
    import subprocess

    from kdbench import envinfo

    def no_git(*args):
        raise subprocess.CalledProcessError(128, "git")

    monkeypatch.setattr(envinfo, "_git", no_git)
    monkeypatch.setenv("KDBENCH_GIT_SHA", "25be075")
    assert envinfo.git_state() == {"sha": "25be075", "dirty": False, "reason": "from $KDBENCH_GIT_SHA"}
    monkeypatch.delenv("KDBENCH_GIT_SHA")
    assert envinfo.git_state()["sha"] == ""


def test_git_sha_from_the_environment_wins_over_a_stale_checkout(monkeypatch):
    """The device's copy can carry an older .git than its files: the commit the caller names is recorded."""
    from kdbench import envinfo

    monkeypatch.setattr(envinfo, "_git", lambda *args: "fa772f6" if args[0] == "rev-parse" else " M suite/x.py")
    monkeypatch.delenv("KDBENCH_GIT_SHA", raising=False)
    assert envinfo.git_state() == {"sha": "fa772f6", "dirty": True}
    monkeypatch.setenv("KDBENCH_GIT_SHA", "2666237")
    assert envinfo.git_state() == {"sha": "2666237", "dirty": False, "reason": "from $KDBENCH_GIT_SHA"}
