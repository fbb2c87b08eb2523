"""What a case will cost before it runs: peak memory (host, device) and a rough time, from its shape alone
(napkin math, no allocation), and whether it fits this machine. `kdbench list` shows it; `kdbench run` refuses
a scenario that does not fit (exit 2, the estimate in the message) unless --force.

Memory figures are upper bounds calibrated on the code as written (bytes per element of the largest arrays a
case holds at once: inputs, the float64 check, the torch baselines' score matrices); times assume nominal rates
(RATES), so they say "seconds" vs "hours", not more.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from kdbench.backends import registry
from kdbench.references.model import weight_shapes
from kdbench.references.model_config import get_preset

GB = 1e9
# nominal rates: (bytes/s, float64 reference FLOP/s, backend FLOP/s); the host reference runs numpy float64
RATES = {"cpu": (5e9, 2e9, 5e9), "cuda": (2e12, 2e9, 3e14)}
DRAW_S = 2e-8          # seconds per random input element on one host core (numpy's generators)
SCORE_BYTES = 13       # torch baselines per score element: fp32 scores, masked copy, exp, bool mask repeat
KV_COMPACT_BYTES = 64  # per cache element: float64 draw, float32 copy, device copy, float64 check temporaries
HEAP_S = 3e-6          # seconds per node of a host best-first heap (h200_facts: 150 ms for 64 x 1024 nodes)
HEADROOM = 0.8         # a case may use at most this share of the memory available (allocator, Python, plots)


@dataclass(frozen=True)
class Estimate:
    host_bytes: float      # peak host memory (on CPU runs this includes what the backends allocate)
    device_bytes: float    # peak GPU memory (0 on CPU runs)
    seconds: float         # rough wall time of the case

    def text(self) -> str:
        dev = f", GPU {self.device_bytes / GB:.1f} GB" if self.device_bytes else ""
        return f"~{self.host_bytes / GB:.1f} GB host{dev}, ~{_duration(self.seconds)}"


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h")


def case(c, device: str) -> Estimate:
    """The estimate of one config.Case on `device` ("cpu" | "cuda"), for the backends available there."""
    live = [b for b in c.backends if registry.available(b, device)[0]]
    if not live:
        return Estimate(0.0, 0.0, 0.0)
    if c.kind == "kernel":
        return _kernel(c, live, device)
    if c.kind in ("acceptance", "e2e"):
        return _generation(c, live, device)
    return Estimate(0.0, 0.0, 0.0)   # topology: schema only in this wave


def _kernel(c, live: list[str], device: str) -> Estimate:
    inputs, work, ref_flops, flops, moved = _FAMILY[c.family](c.shape, c, live)
    bw, ref_rate, rate = RATES[device]
    calls = (c.trials + c.timing.warmup + c.timing.repeat + 2) * len([b for b in live if b != "numpy_ref"])
    seconds = c.trials * (ref_flops / ref_rate + DRAW_S * inputs / 4) + calls * max(moved / bw, flops / rate)
    if device == "cpu":   # the OOM killer ends a CPU run: the backends' working sets must fit too
        return Estimate(inputs + work, 0.0, seconds)
    # on a GPU a baseline out of memory at a shape is a skip with that reason (kinds/kernel.py), so only the
    # inputs (a bf16 and a float32 copy at most) must fit
    return Estimate(inputs, 2 * inputs, seconds)


def _verify(s, c, live):
    """tree_verify_mla: q + kv in float32 on the host; torch baselines hold [B, T*H, S] score matrices."""
    rows, keys = s.batch * s.nodes * s.heads, s.past_len + s.nodes
    inputs = 4.0 * (s.batch * keys * (s.kv_lora + s.rope) + rows * (s.kv_lora + s.rope))
    torch_rows = any(registry.role(b) == "baseline" for b in live)
    work = SCORE_BYTES * rows * keys * (2 if "torch_twopass" in live else 1) if torch_rows else 4.0 * rows * 512
    flops = 2.0 * (2 * (s.kv_lora + s.rope)) * rows * keys
    checked = min(rows, 2 * s.nodes * 4) if rows * keys > 2.5e8 else rows
    return inputs, work, flops * checked / max(rows, 1), flops, inputs


def _build(s, c, live):
    """Logits [B, L, V] float32; top-K + logsumexp cost ~30 ops per logit on a CPU; the host heaps (reference,
    torch, cpu_heap) ~HEAP_S per tree node, charged as FLOPs at the reference rate."""
    elements = float(s.batch * s.depth * s.vocab)
    heap = s.batch * s.budget * HEAP_S * RATES["cpu"][1]
    return 4 * elements, 12 * elements, 30 * elements + heap, 30 * elements + heap, 4 * elements


def _accept(s, c, live):
    n = s.budget + 1
    per = 24.0 * s.vocab if s.mode == "sampled" else 64.0   # dirichlet float64, its sum, the float32 copy
    total = s.batch * n * per
    return total, total, float(s.batch * n * s.vocab), float(s.batch * n * s.vocab), total / 3


def _compact(s, c, live):
    elements = float(s.layers * s.batch * (s.past_len + s.budget + 1) * s.dim)
    moved = 2.0 * s.layers * s.batch * (s.depth + 1) * s.dim * 4
    return elements * 4, elements * (KV_COMPACT_BYTES - 4), elements, 0.0, moved


def _moe(s, c, live):
    """moe_experts: the touched experts' float32 weights on the host (at most min(E, rows * k) experts), the full
    [E, ...] device copies (host memory on a CPU run), the slots' [S, d + mi] temporaries; FLOPs 6 d mi per slot."""
    slots, per = s.rows * s.topk, 3.0 * s.hidden * s.inter
    inputs = 4.0 * (min(s.experts, slots) * per + s.rows * s.hidden)
    work = 4.0 * (s.experts * per + 4 * slots * (s.hidden + s.inter))
    flops = 2.0 * slots * per
    return inputs, work, flops, flops, inputs / 2


_FAMILY = {"tree_verify_mla": _verify, "tree_build": _build, "tree_accept": _accept, "kv_compact": _compact,
           "moe_experts": _moe}


def _generation(c, live: list[str], device: str) -> Estimate:
    """Weights + KV cache + the verify logits [B, N, V] (float32, x3: logits, softmax, the accept copy)."""
    s = c.shape
    cfg = get_preset(s.model)
    elem = {"float32": 4, "bfloat16": 2, "float64": 8}.get(s.dtype) or (
        2 if device == "cuda" else (8 if s.model.startswith("tiny") else 4))
    weights = elem * float(sum(math.prod(shape) for shape in weight_shapes(cfg).values()))
    rows = (s.budget if s.policy != "ar" else 0) + 1
    max_len = s.prompt_len + s.max_new_tokens + 2 * (s.draft_len + 1) + rows
    cache = elem * float(cfg.n_layers * s.batch * max_len * cfg.kv_dim)
    logits = 12.0 * s.batch * max(rows, s.draft_len) * cfg.vocab_size
    total = weights + cache + logits
    forwards = 2 * math.ceil(s.prompts / s.batch) * s.max_new_tokens * len(live)   # AR + speculative, upper bound
    seconds = forwards * weights / RATES[device][0]
    return Estimate(total, 0.0, seconds) if device == "cpu" else Estimate(0.0, total, seconds)


# ------------------------------------------------------------------------------------------ the machine

@dataclass(frozen=True)
class Machine:
    device: str
    host_bytes: float         # memory available to this run (MemAvailable, else physical)
    device_bytes: float       # GPU memory (0 without one)


def machine(device: str) -> Machine:
    """Memory available now (MemAvailable: what other processes leave), else physical memory."""
    host = _mem_available() or float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    gpu = 0.0
    if device == "cuda":
        import torch   # noqa: PLC0415  (only for a GPU run; torch is loaded by then)
        gpu = float(torch.cuda.get_device_properties(0).total_memory)
    return Machine(device, host, gpu)


def _mem_available() -> float:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024   # kB
    except OSError:
        pass
    return 0.0


def verdict(cases: list, m: Machine) -> tuple[bool, str]:
    """(fits, why not): every backend of every case unavailable, or the largest case's estimate over the
    machine's memory (host or GPU)."""
    live = [cs for cs in cases if any(registry.available(b, m.device)[0] for b in cs.backends)]
    if not live:
        reasons = sorted({registry.available(b, m.device)[1] for cs in cases for b in cs.backends})
        return False, f"no backend of it can run here ({'; '.join(reasons)[:300]})"
    worst = max(live, key=lambda cs: max(case(cs, m.device).host_bytes, case(cs, m.device).device_bytes))
    e = case(worst, m.device)
    if e.host_bytes > HEADROOM * m.host_bytes or e.device_bytes > HEADROOM * (m.device_bytes or math.inf):
        have = f"{m.host_bytes / GB:.0f} GB host available" + (f", {m.device_bytes / GB:.0f} GB GPU" if m.device_bytes else "")
        return False, f"case {worst.name} needs {e.text()}; this machine has {have} (a case may use {HEADROOM:.0%})"
    return True, ""
