"""Link modes -> NCCL settings, the check that the machine can provide the requested link, and the transport
NCCL actually used, read back from its NCCL_DEBUG=INFO log ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read").
nvlink: NCCL's defaults (P2P over NVLink); pcie: NCCL_P2P_DISABLE=1 (GPU -> host memory -> GPU over PCIe, the
SHM transport); auto: defaults, whatever the machine has. A link that cannot be had is a skip, not a fallback.
"""
from __future__ import annotations

import re
from pathlib import Path

LINKS = ("nvlink", "pcie", "auto")
LOG_NAME = "nccl.%h.%p.log"          # NCCL expands %h (host) and %p (pid): one file per rank
_VIA = re.compile(r"Channel \d+/\d+ : (\d+)\[\d+\] -> (\d+)\[\d+\](?: \[\w+\])? via (\S+)")
_INIT = re.compile(r"NCCL version (\S+)")


def nccl_env(link: str, log_dir: str) -> dict[str, str]:
    """Environment every rank sets before init_process_group."""
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P,SHM,NET", "NCCL_DEBUG_FILE": str(Path(log_dir, LOG_NAME))}
    if link == "pcie":
        env["NCCL_P2P_DISABLE"] = "1"
    return env


def unavailable(link: str, world: int, pairs) -> str:
    """'' when `world` GPUs (0 .. world-1) can use `link`, else why not (the case's skip reason)."""
    if link == "auto":
        return ""
    if world < 2:
        return f"link {link} needs >= 2 GPUs (gpus: {world} has no link to use; use link: auto)"
    if link == "pcie":
        return ""                                   # host staging over PCIe works between any two GPUs
    if not pairs:
        return f"link nvlink: cannot confirm NVLink between GPUs ({getattr(pairs, 'reason', '') or 'no pairs'})"
    used = [p for p in pairs if p["a"] < world and p["b"] < world]
    slow = [f"GPU{p['a']}-GPU{p['b']} {p['detail']}" for p in used if p["link"] != "nvlink"]
    return f"link nvlink: not every GPU pair has NVLink ({'; '.join(slow)})" if slow else ""


def parse_logs(log_dir: str) -> dict:
    """{transports: sorted distinct transports, e.g. ['P2P/CUMEM/read'], kinds: ['P2P'], channels: count,
    version, files}. One rank (no peer): no channel lines, transports empty."""
    transports, kinds, channels, version = set(), set(), 0, ""
    files = sorted(Path(log_dir).glob("nccl.*.log"))
    for f in files:
        for line in f.read_text(errors="replace").splitlines():
            m = _VIA.search(line)
            if m:
                channels += 1
                transports.add(m.group(3))
                kinds.add(m.group(3).split("/")[0])
            v = _INIT.search(line)
            if v and not version:
                version = v.group(1)
    return {"transports": sorted(transports), "kinds": sorted(kinds), "channels": channels, "version": version,
            "files": len(files)}


def summary(parsed: dict, world: int) -> str:
    """One phrase for the row: 'P2P/CUMEM/read' | 'SHM/direct/direct' | 'none (1 rank)' | 'not logged'."""
    if world == 1:
        return "none (1 rank: no peer transport)"
    return ", ".join(parsed["transports"]) or "not logged (no NCCL channel lines)"


def mismatch(link: str, parsed: dict, world: int) -> str:
    """'' when NCCL used what the link mode asked for; else the failure reason (never a silent fallback)."""
    if world < 2 or link == "auto":
        return ""
    kinds = set(parsed["kinds"])
    if not kinds:
        return f"link {link}: NCCL logged no transport, cannot confirm the link"
    if link == "nvlink" and kinds != {"P2P"}:
        return f"link nvlink requested but NCCL used {sorted(kinds)}"
    if link == "pcie" and "P2P" in kinds:
        return "link pcie requested (NCCL_P2P_DISABLE=1) but NCCL still used P2P"
    return ""
