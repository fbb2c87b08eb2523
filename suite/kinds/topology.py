"""topology kind: the schema and the link/transport fields only in this wave. The tensor- and
expert-parallel runs over NVLink vs PCIe come with the multi-GPU issue; until then each case is recorded
as skipped with that reason, and the GPU pairs this machine has (from NVML) are attached."""
from __future__ import annotations

from collections.abc import Iterator

from kdbench.results import Record

REASON = "multi-GPU runs (tensor/expert parallel over NVLink vs PCIe) are not implemented in this wave"


def run(case, ctx) -> Iterator[Record]:
    from kdbench.topology import gpu_pairs
    s = case.shape
    transport = "NCCL P2P over NVLink" if s.link == "nvlink" else "NCCL_P2P_DISABLE=1 (host-staged PCIe)"
    yield ctx.record(case, ",".join(case.backends), link=s.link, status="skipped", reason=REASON,
                     extra={"transport": transport, "gpus": s.gpus, "parallel": s.parallel, "pairs": gpu_pairs()})
