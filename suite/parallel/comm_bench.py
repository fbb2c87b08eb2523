"""Collective microbenchmarks with nccl-tests' definitions (its doc/PERFORMANCE.md): size = the larger per-rank
buffer in bytes (all-reduce: the buffer; all-gather: the gathered output; reduce-scatter: the input;
all-to-all: the send buffer), algbw = size / time, busbw = algbw x factor with factor 2(n-1)/n for
all-reduce and (n-1)/n for all-gather, reduce-scatter and all-to-all (0 at one rank: nothing crosses a link).
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from kdbench.timing import between_s, stamp

from .comm import Comm
from .messages import bus_factor

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def default_sizes(lo: int = 4 << 10, hi: int = 1 << 30) -> tuple[int, ...]:
    """Powers of two from 4 KiB to 1 GiB."""
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return tuple(out)


def iterations(nbytes: int) -> tuple[int, int]:
    """(warmup, timed) per size: more at small sizes, where one call is microseconds."""
    return (2, 5) if nbytes >= 64 << 20 else (3, 20)


def _call(op: str, comm: Comm, nbytes: int, dtype: torch.dtype):
    """(closure running one collective, its size in bytes): nbytes rounded down to whole elements, a multiple
    of world (at least world elements)."""
    n, el = comm.world, torch.empty((), dtype=dtype).element_size()
    count = max(nbytes // el // n, 1) * n
    buf = torch.ones(count, dtype=dtype, device=comm.device)
    size, part = count * el, buf[: count // n].clone()
    if op == "all_reduce":
        return (lambda: dist.all_reduce(buf)), size
    if op == "all_gather":
        return (lambda: dist.all_gather_into_tensor(buf, part)), size
    if op == "reduce_scatter":
        return (lambda: dist.reduce_scatter_tensor(part, buf)), size
    out = torch.empty_like(buf)
    return (lambda: dist.all_to_all_single(out, buf)), size


def time_op(op: str, comm: Comm, nbytes: int, dtype=torch.bfloat16) -> dict:
    """Median over timed calls, each barrier-aligned (the slowest rank sets the time, as in nccl-tests)."""
    fn, nbytes = _call(op, comm, nbytes, dtype)
    warm, rep = iterations(nbytes)
    samples = []
    for i in range(warm + rep):
        dist.barrier()
        cuda = comm.device.type == "cuda"
        a = stamp(cuda)
        fn()
        b = stamp(cuda)
        if cuda:
            b.synchronize()
        s = between_s(a, b)
        if i >= warm:
            samples.append(s)
    t = statistics.median(samples)
    algbw = nbytes / t
    return {"op": op, "bytes": nbytes, "samples_s": samples, "time_s": t, "algbw_Bps": algbw,
            "busbw_Bps": algbw * bus_factor(op, comm.world), "world": comm.world, "dtype": str(dtype)[6:]}


def run(job, comm: Comm, step: list[tuple[str, int]] = ()) -> list[dict]:
    """Every op at every job.comm_bench size, then the (op, bytes) messages the sharded step sent."""
    out = [dict(time_op(op, comm, s), source="sweep") for s in job.comm_bench for op in OPS]
    out += [dict(time_op(op, comm, s), source="step") for op, s in step]
    return out
