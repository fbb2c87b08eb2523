"""GPU pair topology from NVML: NVLink count per pair (direct or through NVSwitch) or the PCIe path level,
and a text matrix like `nvidia-smi topo -m`. Empty, with a reason, where NVML or a second GPU is missing.
"""
from __future__ import annotations

# nvmlDeviceGetTopologyCommonAncestor levels -> nvidia-smi's names for a PCIe path
PCIE_LEVELS = {0: "SELF", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
PCIE_MEANING = {
    "PIX": "one PCIe switch", "PXB": "several PCIe switches", "PHB": "through the PCIe host bridge",
    "NODE": "across host bridges in one NUMA node", "SYS": "across NUMA nodes (SMP interconnect)",
}


class Pairs(list):
    """A list of pair dicts that also says why it is empty (`reason`), e.g. no NVML or a single GPU."""

    def __init__(self, items=(), reason: str = ""):
        super().__init__(items)
        self.reason = reason


def _bus_id(pci) -> str:
    """Normalised 'dddd:bb:dd.f' so NVML's 8-digit and 4-digit PCI domains compare equal."""
    bus = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
    domain, rest = bus.lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _nvlinks(nv, handle) -> tuple[list[str], int]:
    """Active NVLinks of a GPU: remote GPU bus ids (one entry per direct link) and the count to NVSwitches."""
    peers, to_switch = [], 0
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nv.nvmlDeviceGetNvLinkState(handle, link) != nv.NVML_FEATURE_ENABLED:
                continue
        except nv.NVMLError:
            continue   # link index past this GPU's links, or NVLink not supported at all
        try:
            kind = nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except nv.NVMLError:
            kind = None   # older driver: fall back to the remote PCI id, which only matches a peer GPU
        if kind == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            to_switch += 1
            continue
        try:
            peers.append(_bus_id(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)))
        except nv.NVMLError:
            continue
    return peers, to_switch


def _p2p_nvlink_ok(nv, ha, hb) -> bool:
    """Whether the driver reports NVLink P2P between the two (switch links alone do not prove a route)."""
    try:
        return nv.nvmlDeviceGetP2PStatus(ha, hb, nv.NVML_P2P_CAPS_INDEX_NVLINK) == nv.NVML_P2P_STATUS_OK
    except nv.NVMLError:
        return True   # older drivers lack the query; trust the switch links as nvidia-smi does


def _pair(nv, i: int, j: int, handles, links, bus_ids) -> dict:
    direct = links[i][0].count(bus_ids[j])
    # NVSwitch fabric (HGX): every GPU on the switches reaches every other over all its switch links,
    # which is what nvidia-smi prints as NV18 for an H200 pair
    via_switch = min(links[i][1], links[j][1]) if _p2p_nvlink_ok(nv, handles[i], handles[j]) else 0
    n = direct + via_switch
    level = nv.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
    pcie = PCIE_LEVELS.get(int(level), f"level-{int(level)}")
    if n:
        how = "direct" if direct and not via_switch else "via NVSwitch" if not direct else "direct + NVSwitch"
        detail = f"NV{n} ({how}); PCIe path {pcie}"
        return {"a": i, "b": j, "link": "nvlink", "nvlinks": n, "detail": detail, "pcie": pcie}
    detail = f"{pcie}: {PCIE_MEANING.get(pcie, 'unknown PCIe path')}"
    return {"a": i, "b": j, "link": "pcie", "nvlinks": 0, "detail": detail, "pcie": pcie}


def gpu_pairs() -> Pairs:
    """One dict per GPU pair a < b: {a, b, link: 'nvlink' | 'pcie', nvlinks, detail, pcie}."""
    try:
        import pynvml as nv
        nv.nvmlInit()
    except Exception as exc:   # noqa: BLE001 - CPU machine or no driver: say why, return nothing
        return Pairs(reason=f"no NVML: {type(exc).__name__}: {exc}")
    try:
        count = nv.nvmlDeviceGetCount()
        if count < 2:
            return Pairs(reason=f"{count} GPU(s): no pairs")
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        bus_ids = [_bus_id(nv.nvmlDeviceGetPciInfo(h)) for h in handles]
        links = [_nvlinks(nv, h) for h in handles]
        return Pairs([_pair(nv, i, j, handles, links, bus_ids)
                      for i in range(count) for j in range(i + 1, count)])
    except Exception as exc:   # noqa: BLE001 - a partial NVML failure must not stop a run
        return Pairs(reason=f"NVML topology query failed: {type(exc).__name__}: {exc}")
    finally:
        nv.nvmlShutdown()


def matrix_text(pairs: Pairs | None = None) -> str:
    """`nvidia-smi topo -m` style: X on the diagonal, NV<n> for NVLink pairs, the PCIe level otherwise."""
    pairs = gpu_pairs() if pairs is None else pairs
    if not pairs:
        return f"no GPU topology: {getattr(pairs, 'reason', '') or 'no pairs'}"
    n = 1 + max(max(p["a"], p["b"]) for p in pairs)
    cell = {(i, i): "X" for i in range(n)}
    for p in pairs:
        label = f"NV{p['nvlinks']}" if p["link"] == "nvlink" else p["pcie"]
        cell[(p["a"], p["b"])] = cell[(p["b"], p["a"])] = label
    names = [f"GPU{i}" for i in range(n)]
    lines = [" " * 8 + "".join(f"{x:<8}" for x in names)]
    for i, name in enumerate(names):
        lines.append(f"{name:<8}" + "".join(f"{cell.get((i, j), '?'):<8}" for j in range(n)))
    return "\n".join(lines)
