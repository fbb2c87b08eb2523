"""moe_experts family: the routed experts of one MoE layer, y = sum_j w[:, j] W2 (silu(W1 x) * W3 x) with expert
idx[:, j] (the dispatch model/moe.py selects; routing itself is shared code, tested in test_model / test_ref_moe).
Only the experts the rows touch get weights drawn: no backend reads another expert, and a 384-expert layer of
real width is 17e9 values. The other experts are zero on the device (an expert read by mistake adds nothing
visible, but the bytes floor counts touched experts only, so a backend reading them shows as slow)."""
from __future__ import annotations

import numpy as np
import torch

from kdbench.backends import registry
from kdbench.families import common
from kdbench.references import moe as ref

ROUTED_SCALING = 2.827    # Kimi K2's: routing weights sum to this per row
SKEW = 1.2                # skewed routing: expert e drawn with probability ~ 1 / (e + 1)^SKEW
HALF_ONLY = ("moe_triton", "moe_flashinfer", "moe_liger")


def _experts(rng: np.random.Generator, s) -> np.ndarray:
    """[rows, topk] distinct experts per row (Gumbel top-k: a draw without replacement per row)."""
    if s.routing == "same":
        return np.broadcast_to(rng.permutation(s.experts)[:s.topk], (s.rows, s.topk)).astype(np.int64)
    logp = np.zeros(s.experts) if s.routing == "uniform" else -SKEW * np.log1p(rng.permutation(s.experts))
    keys = logp + rng.gumbel(size=(s.rows, s.experts))
    return np.argsort(-keys, axis=1, kind="stable")[:, :s.topk].astype(np.int64)


def make_inputs(case, seed: int) -> dict:
    s, rng, dt = case.shape, np.random.default_rng(seed), common.run_dtype(case.dtype)
    idx = np.ascontiguousarray(_experts(rng, s))
    u = rng.uniform(0.05, 1.0, (s.rows, s.topk))
    weights = (u / u.sum(axis=1, keepdims=True) * ROUTED_SCALING).astype(np.float32)
    touched = np.unique(idx)
    return {"x": common.standard_normal(rng, (s.rows, s.hidden), dt), "idx": idx, "weights": weights,
            "n_experts": np.int64(s.experts),
            "touched": touched,   # [U] ascending; w1/w3 [U, mi, d], w2 [U, d, mi]: the touched experts' weights
            "w1": common.standard_normal(rng, (len(touched), s.inter, s.hidden), dt, s.hidden ** -0.5),
            "w3": common.standard_normal(rng, (len(touched), s.inter, s.hidden), dt, s.hidden ** -0.5),
            "w2": common.standard_normal(rng, (len(touched), s.hidden, s.inter), dt, s.inter ** -0.5)}


def reference(inputs: dict, case) -> dict:
    """float64, expert by expert in ascending id (references/moe.py's SwiGLU)."""
    local = np.searchsorted(inputs["touched"], inputs["idx"])   # expert id -> its row in w1/w2/w3
    w1, w2, w3 = (inputs[w].astype(np.float64) for w in ("w1", "w2", "w3"))
    return {"y": ref.routed_experts(inputs["x"].astype(np.float64), local, inputs["weights"].astype(np.float64),
                                    w1, w2, w3)}


def unsupported(backend: str, case) -> str | None:
    if backend in HALF_ONLY and case.dtype != "bfloat16":
        return f"{backend} runs bf16 weights only (got dtype {case.dtype})"
    return None


reference_for = common.case_reference   # every backend does the whole work


def _on_device(inputs: dict, device: str, dtype: str) -> tuple:
    """(x, idx, weights, w1, w2, w3) on the device, once per inputs and dtype; the full [E, ...] expert tensors
    with the touched experts filled. Every backend only reads them (a writer fails its re-check after timing)."""
    cache = inputs.setdefault("_device", {})
    if (device, dtype) not in cache:
        E = int(inputs["n_experts"])
        t = common.TORCH_DTYPES[dtype]
        touched = torch.from_numpy(inputs["touched"]).to(device)
        full = []
        for name in ("w1", "w2", "w3"):
            part = common.to_torch(inputs[name], device, dtype)
            w = torch.zeros((E,) + tuple(part.shape[1:]), dtype=t, device=device)
            full.append(w.index_copy_(0, touched, part))
        cache[(device, dtype)] = (common.to_torch(inputs["x"], device, dtype), common.to_torch(inputs["idx"], device),
                                  common.to_torch(inputs["weights"], device), *full)
    return cache[(device, dtype)]


def timed(backend: str, inputs: dict, case, device: str):
    dtype = common.run_dtype(case.dtype)
    args = _on_device(inputs, device, dtype)
    op = registry.get(backend).op("moe_experts")
    return lambda: op(*args)


def run(backend: str, inputs: dict, case, device: str) -> dict:
    return outputs(backend, timed(backend, inputs, case, device)(), inputs, case)


def outputs(backend: str, result, inputs: dict, case) -> dict:
    return {"y": common.to_numpy(result).astype(np.float64)}


def check(got: dict, want: dict, tol):
    return common.check_outputs(got, want, tol)


def bytes_moved(case, inputs: dict) -> float:
    """The floor's bytes: each touched expert's three matrices read once, x read, y written (idx, weights and
    any intermediate a backend keeps are its own overhead, not part of the floor)."""
    s, e = case.shape, common.ELEMENT_BYTES[common.run_dtype(case.dtype)]
    return float(len(inputs["touched"]) * 3 * s.hidden * s.inter * e + 2 * s.rows * s.hidden * e)


def flops(case, inputs: dict) -> float:
    """Three GEMMs of 2 d mi per (row, slot)."""
    s = case.shape
    return float(2 * 3 * s.rows * s.topk * s.hidden * s.inter)
