"""topology kind: a sharded run (kdbench.parallel) per case on `gpus` ranks, launched here (spawn), NCCL on
GPUs with the link mode's settings, gloo processes on the CPU. Rows: one per phase (the sharded time, its
compute / communication split per layer, equality with one process), one per collective microbenchmark
point; every row carries the requested link, the transport NCCL used and the NVML topology matrix.
A link or GPU count the machine cannot provide is a skipped row with the reason; a rank that fails is an
error row for that case only (plans/0011-multi-gpu.md)."""
from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from kdbench import topology
from kdbench.config import derive_seed
from kdbench.kinds.generation import model_dtype
from kdbench.parallel import comm_bench, link
from kdbench.parallel.job import Job
from kdbench.parallel.launch import launch
from kdbench.parallel.rows import comm_rows, phase_rows
from kdbench.parallel.shard import check_divisible
from kdbench.references.model_config import get_preset
from kdbench.results import Record


def run(case, ctx) -> Iterator[Record]:
    s = case.shape
    pairs = topology.gpu_pairs()
    common = {"link": s.link, "gpus": s.gpus, "parallel": s.parallel, "pairs": list(pairs),
              "topology_matrix": topology.matrix_text(pairs)}
    backend = case.backends[0]          # config: exactly one per topology case
    why = _unavailable(case, ctx, pairs)
    if why:
        yield ctx.record(case, backend, link=s.link, status="skipped", reason=why, extra=common)
        return
    job = _job(case, ctx)
    res = launch(job)
    logs = link.parse_logs(job.out_dir) if ctx.device == "cuda" else {"transports": [], "kinds": []}
    common.update(transport=link.summary(logs, s.gpus) if ctx.device == "cuda" else "gloo (CPU processes)",
                  nccl=logs, env=job.env, world=s.gpus, launch_s=res.elapsed_s)
    if not res.ok:
        yield ctx.record(case, backend, link=s.link, status="error", reason=res.error, extra=common)
        return
    ranks = [json.loads(Path(job.out_dir, f"rank{r}.json").read_text()) for r in range(s.gpus)]
    bad_link = link.mismatch(s.link, logs, s.gpus) if ctx.device == "cuda" else ""
    for rec in phase_rows(case, ctx, backend, ranks, common) + comm_rows(case, ctx, ranks[0], common):
        if bad_link:
            rec.status, rec.reason = "fail", bad_link
        yield rec


def _unavailable(case, ctx, pairs) -> str:
    """The skip reason, or ''."""
    s = case.shape
    if "cuda" in case.backends and ctx.device != "cuda":
        return "backend cuda (the tree_verify_mla kernel) needs --device cuda"
    if ctx.device == "cpu":
        if s.link != "auto":
            return f"link {s.link} selects an NCCL transport between GPUs; --device cpu runs gloo (use link: auto)"
    else:
        have = torch.cuda.device_count()
        if s.gpus > have:
            return f"needs {s.gpus} GPUs, this machine has {have}"
        why = link.unavailable(s.link, s.gpus, pairs)
        if why:
            return why
    parallel_why = check_divisible(get_preset(s.model), s.gpus, s.parallel)
    if parallel_why:
        return parallel_why
    if s.fault != "none" and s.fault_rank >= s.gpus:
        return f"fault_rank {s.fault_rank} is not a rank of {s.gpus}"
    return ""


def _job(case, ctx) -> Job:
    s = case.shape
    out = Path(ctx.run_dir, "parallel", re.sub(r"[^A-Za-z0-9_.-]+", "_", case.name))
    shutil.rmtree(out, ignore_errors=True)
    dtype = str(model_dtype(ctx.device, s)).replace("torch.", "")
    sizes = comm_bench.default_sizes(hi=s.comm_max_bytes) if s.comm_bench else ()
    env = link.nccl_env(s.link, str(out)) if ctx.device == "cuda" else {}
    return Job(model=s.model, seed=derive_seed(case.scenario, s.model), dtype=dtype, parallel=s.parallel,
               ep_dispatch=s.ep_dispatch,
               world=s.gpus, device=ctx.device, out_dir=str(out), batch=s.batch, prompt_len=s.prompt_len,
               budget=s.budget, phases=tuple(s.phases), check=s.check, warmup=s.warmup, repeat=s.repeat,
               attn="cuda" if "cuda" in case.backends else "torch", timeout_s=s.timeout_s, fault=s.fault,
               fault_rank=s.fault_rank, comm_bench=sizes, comm_bench_step=s.comm_bench, env=env)
