"""Per-phase arguments, timing with the compute / communication split per layer, and the comparison with the
one-process model. A phase's time is one forward, barrier-aligned across ranks; communication is the sum of
the timed collectives, compute the rest of the layer (GPU: CUDA events; CPU: perf_counter)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kdbench.timing import between_s, stamp

from .comm import Comm
from .job import Inputs, Job


@dataclass
class PhaseArgs:
    tokens: torch.Tensor
    positions: torch.Tensor
    past: torch.Tensor                 # [B] int32
    anc: torch.Tensor | None
    kw: dict

    def positional(self, cache) -> tuple:
        return (self.tokens, self.positions, cache, self.past, self.anc)


def phase_args(phase: str, x: Inputs, job: Job, device) -> PhaseArgs:
    """prefill: the prompt, causal from 0 (logits of the last row, as the engine asks); decode: one token at
    P; verify: the tree at P + 1 (positions = P + 1 + depth), every row's logits."""
    B, P = x.prompt.shape
    dev = lambda t: t.to(device)   # noqa: E731
    if phase == "prefill":
        last = torch.full((B,), P - 1, dtype=torch.int64)
        return PhaseArgs(dev(x.prompt), dev(torch.arange(P).expand(B, P)), dev(torch.zeros(B, dtype=torch.int32)),
                         None, {"logit_rows": dev(last)})
    if phase == "decode":
        return PhaseArgs(dev(x.decode), dev(torch.full((B, 1), P)), dev(torch.full((B,), P, dtype=torch.int32)),
                         None, {})
    if phase == "verify":
        return PhaseArgs(dev(x.tree), dev(P + 1 + x.depth), dev(torch.full((B,), P + 1, dtype=torch.int32)),
                         dev(x.anc), {})
    raise ValueError(f"unknown phase {phase!r}")


def time_phase(model, comm: Comm, args: PhaseArgs, cache, job: Job) -> dict:
    """warmup + repeat forwards (identical inputs: the cache rows are rewritten with the same values).
    Returns per-repeat step and layer seconds, the collectives sent ([layer, op, bytes] in order) with their
    seconds per repeat, the logits of the last run and their digest."""
    dev = model.device
    steps, calls, call_s, layer_s = [], [], [], {}
    for i in range(job.warmup + job.repeat):
        timed = i >= job.warmup
        comm.timing, comm.events, model.layer_marks = timed, [], []
        dist.barrier()
        t0 = stamp(dev.type == "cuda")
        logits = model.forward(*args.positional(cache), **args.kw).logits
        t1 = stamp(dev.type == "cuda")
        if not timed:
            continue
        events = comm.seconds()                               # synchronizes the GPU once
        steps.append(between_s(t0, t1))
        calls = [[layer, op, nbytes] for layer, op, nbytes, _ in events]     # the same sequence every run
        call_s.append([s for *_, s in events])
        marks = {(lay, what): ev for lay, what, ev in model.layer_marks}
        for lay in range(model.cfg.n_layers):
            layer_s.setdefault(lay, []).append(between_s(marks[(lay, "start")], marks[(lay, "end")]))
    comm.timing = False
    return {"step_s": steps, "layer_s": {str(k): v for k, v in layer_s.items()},
            "calls": calls, "call_s": [list(c) for c in zip(*call_s)],   # [call][repeat] seconds
            "rows": int(args.tokens.numel()), "digest": digest(logits), "logits": logits}


def digest(t: torch.Tensor) -> str:
    """sha256 of the tensor's bytes: every rank must hold the same output."""
    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def host_syncs(model, args: PhaseArgs, cache) -> str:
    """GPU: one more forward under torch.cuda.set_sync_debug_mode("error"): 'none' when nothing in it reads a
    device value on the host (the step could be captured), else the first offending call. CPU: ''."""
    if model.device.type != "cuda":
        return ""
    torch.cuda.set_sync_debug_mode("error")
    try:
        model.forward(*args.positional(cache), **args.kw)
        return "none"
    except RuntimeError as exc:
        return str(exc).splitlines()[0][:200]
    finally:
        torch.cuda.set_sync_debug_mode("default")


def compare(want: torch.Tensor, got: torch.Tensor) -> dict:
    """max |got - want|, relative L2 and bit-equality of the one-process logits (want) and the sharded ones.
    An all-zero `want` gives rel_l2 NaN (0/0) or inf, never a small number: rows._verdict fails it."""
    if hasattr(want, "logits"):
        want = want.logits
    w, g = want.double(), got.double()
    diff = (g - w).abs()
    return {"bit_equal": bool(torch.equal(want, got)), "max_abs": float(diff.max()),
            "rel_l2": float(torch.linalg.vector_norm(g - w) / torch.linalg.vector_norm(w)),
            "n_nan": int(torch.isnan(g).sum())}
