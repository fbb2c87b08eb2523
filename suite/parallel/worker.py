"""One rank of a sharded run: join the group, build the model's slice, run the phases (prefill, AR decode, tree
verify; the EP MoE layer alone), time them with the collectives split out, compare with the one-process model
(rank 0), run the collective microbenchmark, and write rank<r>.json. Also the torchrun entry point:
`torchrun --nproc-per-node N -m kdbench.parallel.worker --job job.json` (RANK / WORLD_SIZE / MASTER_* from torchrun).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from kdbench.engine.engine import target_from_preset
from kdbench.model.moe import moe_forward
from kdbench.references.model_config import get_preset

from . import comm_bench, measure
from .comm import Comm
from .ep_moe import ep_experts
from .job import Inputs, Job, make_inputs
from .model import ShardedTransformer


def run_rank(job: Job, rank: int, init_method: str | None = None) -> None:
    """The whole rank; writes out_dir/rank<r>.json. Exceptions propagate (the launcher records them)."""
    os.environ.update(job.env)
    if job.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)                   # ranks share the CPU: one thread each, no oversubscription
    kw = {"device_id": device} if job.device == "cuda" else {}
    dist.init_process_group(job.backend, init_method=init_method, rank=rank, world_size=job.world,
                            timeout=datetime.timedelta(seconds=job.timeout_s), **kw)
    out = _phases(job, rank, device)
    if job.comm_bench or job.comm_bench_step:
        step = sorted({(op, nbytes) for ph in out["phases"].values()
                       for _, op, nbytes in ph.get("calls", [])}) if job.comm_bench_step else []
        out["comm_bench"] = comm_bench.run(job, Comm(rank, job.world, device), step)
    Path(job.out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    # only on success: after an exception the process exits without tearing the group down first, so the
    # failing rank's traceback is on disk before its peers see the connection drop
    dist.destroy_process_group()


def _phases(job: Job, rank: int, device) -> dict:
    comm = Comm(rank, job.world, device)
    kw = dict(attn=job.attn, exact_dispatch=job.ep_dispatch == "exact")
    if job.check and rank == 0:     # the check's one-process reference: the whole model on this rank
        ref = target_from_preset(job.model, job.seed, device=device, dtype=job.torch_dtype())
        model = ShardedTransformer(ref.cfg, ref.w, comm, job.parallel, **kw)
    else:                           # the same values, drawn weight by weight and cut at once (plans/0011)
        ref = None
        model = ShardedTransformer.drawn(get_preset(job.model), job.seed, comm, job.parallel, device,
                                         job.torch_dtype(), **kw)
    inputs = make_inputs(job, model.full_cfg.vocab_size)
    out = {"rank": rank, "world": job.world, "phases": {}}
    cache, ref_cache = None, None
    for phase in job.phases:
        if phase == "decode":
            _maybe_fault(job, rank)
        if phase == "moe":
            out["phases"][phase] = _moe_check(job, model, ref, comm)
            continue
        cache = cache or model.new_cache(job.batch, job.prompt_len + 1 + job.budget + 1)
        ref_cache = ref_cache or (ref.new_cache(job.batch, cache.max_len) if ref is not None else None)
        args = measure.phase_args(phase, inputs, job, device)
        res = measure.time_phase(model, comm, args, cache, job)
        res["host_syncs"] = measure.host_syncs(model, args, cache)
        if ref is not None:
            res["check"] = measure.compare(ref.forward(*args.positional(ref_cache), **args.kw), res.pop("logits"))
        else:
            res.pop("logits")
        out["phases"][phase] = res
    return out


def _moe_check(job: Job, model: ShardedTransformer, ref, comm: Comm) -> dict:
    """The first MoE layer alone: expert-parallel on a token shard + all-gather vs moe_forward on all rows."""
    cfg = model.cfg
    layer = cfg.n_dense_layers
    if layer >= cfg.n_layers:
        return {"skipped": "no MoE layer"}
    g = torch.Generator().manual_seed(job.seed + 1)
    n = job.batch * (job.budget + 1) + 3                  # odd row count: the last shard is zero-padded
    x = torch.randn(n, cfg.hidden, generator=g, dtype=torch.float64).to(model.device, model.dtype)
    y = model._ffn(layer, x[None]).squeeze(0)
    res = {"digest": measure.digest(y)}
    if ref is not None:
        mode = ref.moe_dispatch                               # TP runs moe_forward itself; EP its own experts
        if model.parallel != "tp":
            mode = ep_experts(ref.moe_dispatch, x, ref.w[f"layers.{layer}.experts.w1"])
        res["check"] = measure.compare(moe_forward(ref.w, ref.cfg, layer, x, mode), y)
    return res


def _maybe_fault(job: Job, rank: int) -> None:
    """Test faults: after prefill's collectives, so the other ranks wait in decode's first all-reduce."""
    if job.fault == "none" or rank != job.fault_rank:
        return
    if job.fault == "raise":
        raise RuntimeError(f"injected fault: rank {rank} raised before decode")
    if job.fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if job.fault == "hang":
        time.sleep(10 * job.timeout_s + 3600)


def main(argv: list[str] | None = None) -> int:
    """torchrun entry: one process per rank, the job from --job, the rendezvous from torchrun's env."""
    ap = argparse.ArgumentParser(prog="python -m kdbench.parallel.worker")
    ap.add_argument("--job", required=True, help="a job JSON file (kdbench.parallel.job.Job)")
    args = ap.parse_args(argv)
    job = Job.from_json(Path(args.job).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != job.world:
        print(f"{args.job}: job.world {job.world} but torchrun started WORLD_SIZE {world}", file=sys.stderr)
        return 2
    run_rank(job, rank, init_method="env://")
    return 0


if __name__ == "__main__":
    sys.exit(main())
