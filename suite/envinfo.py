"""The machine fingerprint saved in every run's meta.json and printed by `kdbench env`: host, CPU, RAM, OS,
package versions, GPUs (NVML + torch), git state of the repo, GPU pair topology.
"""
from __future__ import annotations

import math
import os
import platform
import re
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from kdbench import topology

PACKAGES = {"numpy": "numpy", "torch": "torch", "pandas": "pandas", "jinja2": "jinja2",
            "matplotlib": "matplotlib", "pynvml": "nvidia-ml-py"}   # import name -> distribution
REPO_ROOT = Path(__file__).resolve().parents[1]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return math.nan


def _versions() -> dict[str, str]:
    out = {}
    for name, dist in PACKAGES.items():
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                          timeout=10, check=True).stdout.strip()


def git_state() -> dict[str, Any]:
    """sha of HEAD and whether tracked files differ from it. $KDBENCH_GIT_SHA, when set, wins: the GPU
    machine gets a copy of the working tree whose .git (if any) can be an older snapshot than the files (seen
    2026-11-30: records said the session's first commit, "dirty"), so the caller names the commit it sent."""
    sha = os.environ.get("KDBENCH_GIT_SHA", "")
    if sha:
        return {"sha": sha, "dirty": False, "reason": "from $KDBENCH_GIT_SHA"}
    try:
        return {"sha": _git("rev-parse", "HEAD"),
                "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"sha": "", "dirty": False, "reason": f"no git state: {type(exc).__name__}"}


def _nvml_gpus() -> tuple[list[dict[str, Any]], str]:
    try:
        import pynvml as nv
        nv.nvmlInit()
    except Exception as exc:   # noqa: BLE001 - CPU machine: no GPUs, say why
        return [], f"no NVML: {type(exc).__name__}: {exc}"
    try:
        driver = nv.nvmlSystemGetDriverVersion()
        gpus = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(h)
            gpus.append({
                "index": i,
                "name": name.decode() if isinstance(name, bytes) else name,
                "memory_gb": nv.nvmlDeviceGetMemoryInfo(h).total / 1e9,
                "driver": driver.decode() if isinstance(driver, bytes) else driver,
                "sm_clock_max_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
                "mem_clock_max_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
                "power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            })
        return gpus, ""
    except Exception as exc:   # noqa: BLE001
        return [], f"NVML query failed: {type(exc).__name__}: {exc}"
    finally:
        nv.nvmlShutdown()


def _torch_info(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """torch's CUDA build and, per visible GPU, SM count / capability / L2 (NVML does not give SM count)."""
    try:
        import torch
    except ImportError:
        return {"torch_cuda": "", "cuda_available": False}
    info = {"torch_cuda": torch.version.cuda or "", "cuda_available": torch.cuda.is_available()}
    if info["cuda_available"]:
        for g in gpus:
            if g["index"] < torch.cuda.device_count():
                p = torch.cuda.get_device_properties(g["index"])
                g.update(sm_count=p.multi_processor_count, capability=f"{p.major}.{p.minor}",
                         l2_mb=getattr(p, "L2_cache_size", 0) / 2**20)
    return info


# Environment switches the CUDA extension reads on every call (csrc/tree_verify_mla_plan.h, csrc/common.h): a run
# with one set times other plans or launches than the shipped ones, so the fingerprint records them.
KERNEL_KNOBS = ("KDB_TVM_TAIL", "KDB_TVM_SPLITS", "KDB_PDL")


def kernel_knobs() -> dict[str, str]:
    return {k: os.environ[k] for k in KERNEL_KNOBS if k in os.environ}


def fingerprint() -> dict[str, Any]:
    gpus, gpu_reason = _nvml_gpus()
    pairs = topology.gpu_pairs()
    fp = {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "ram_gb": _ram_gb(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": _versions(),
        **_torch_info(gpus),
        "gpus": gpus,
        "gpu_reason": gpu_reason,
        "git": git_state(),
        "kernel_knobs": kernel_knobs(),
        "topology": list(pairs),
        "topology_reason": pairs.reason,
    }
    fp["gpu_slug"] = gpu_slug(fp)
    return fp


def gpu_slug(fp: dict[str, Any]) -> str:
    """'nvidia-h200' from the first GPU's name, 'cpu' without GPUs: the baseline directory name."""
    gpus = fp.get("gpus") or []
    if not gpus:
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", str(gpus[0]["name"]).lower()).strip("-") or "gpu"


def describe(fp: dict[str, Any] | None = None) -> str:
    """Human-readable fingerprint for `kdbench env`."""
    fp = fingerprint() if fp is None else fp
    git = fp.get("git", {})
    lines = [
        f"host      {fp['hostname']}",
        f"cpu       {fp['cpu_model']} ({fp['cpu_cores']} cores), RAM {fp['ram_gb']:.1f} GB",
        f"os        {fp['os']}",
        f"python    {fp['python']}",
        "packages  " + ", ".join(f"{k} {v}" for k, v in fp["packages"].items()),
        f"torch     CUDA build {fp.get('torch_cuda') or 'none'}, cuda available: {fp.get('cuda_available')}",
        f"git       {git.get('sha') or git.get('reason', '?')}{' (dirty)' if git.get('dirty') else ''}",
    ]
    if not fp["gpus"]:
        lines.append(f"gpus      none ({fp['gpu_reason']})")
    for g in fp["gpus"]:
        lines.append(f"gpu{g['index']}      {g['name']}, {g['memory_gb']:.0f} GB, {g.get('sm_count', '?')} SMs, "
                     f"driver {g['driver']}, max clocks SM {g['sm_clock_max_mhz']} / mem "
                     f"{g['mem_clock_max_mhz']} MHz, power limit {g['power_limit_w']:.0f} W")
    lines.append("topology  " + (", ".join(f"GPU{p['a']}-GPU{p['b']}: {p['detail']}" for p in fp["topology"])
                                 or fp.get("topology_reason", "")))
    lines.append(f"slug      {fp['gpu_slug']}")
    return "\n".join(lines)
