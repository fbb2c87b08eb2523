"""DeepSeek-V3 / Kimi K2 mixture of experts in numpy float64: sigmoid + bias group-limited routing
(noaux_tc) and the routed + shared SwiGLU experts (shared/notes/mla_moe.md §2).
"""
from __future__ import annotations

import numpy as np

from .model_config import ModelConfig


def gate_logits_fp32(x: np.ndarray, w_gate: np.ndarray) -> np.ndarray:
    """[N, E] router logits as float32 values (HF computes the gate in fp32), returned as float64.

    x and w are rounded to float32; each product of two float32 values is exact in float64 and the sum is
    taken in float64, then rounded once to float32. So the result is (nearly) the correctly rounded fp32
    dot product, independent of N and of the BLAS: a plain float32 matmul would pick a batch-size- and
    library-dependent summation order and break prefill == decode to 1e-10 (differences of ~1 fp32 ulp).
    """
    x32 = np.asarray(x, dtype=np.float32).astype(np.float64)  # [N, d]
    w32 = np.asarray(w_gate, dtype=np.float32).astype(np.float64)  # [E, d]
    return (x32 @ w32.T).astype(np.float32).astype(np.float64)


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) = inf for x << 0 gives exactly 0, which is right
        return 1.0 / (1.0 + np.exp(-x))


def _topk_lower_index_first(scores: np.ndarray, k: int) -> np.ndarray:
    """[N, k] indices of the k largest per row, ties broken by the lower index (stable sort of -scores)."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


def _group_mask(biased: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """[N, E] bool: experts in the topk_group groups with the highest sum-of-top-2 biased score."""
    n, n_experts = biased.shape
    per_group = n_experts // cfg.n_group
    grouped = np.sort(biased.reshape(n, cfg.n_group, per_group), axis=-1)  # [N, G, E/G] ascending
    group_score = grouped[..., -2:].sum(axis=-1)  # [N, G]: sum of the top-2 (the bias-aware variant)
    kept = _topk_lower_index_first(group_score, cfg.topk_group)  # [N, topk_group]
    keep_group = np.zeros((n, cfg.n_group), dtype=bool)
    np.put_along_axis(keep_group, kept, True, axis=-1)
    return np.repeat(keep_group, per_group, axis=-1)


def _check_routing_config(cfg: ModelConfig, n_experts: int) -> None:
    if n_experts % cfg.n_group or (cfg.n_group > 1 and n_experts // cfg.n_group < 2):
        raise ValueError(f"{cfg.name}: {n_experts} experts do not split into {cfg.n_group} groups of >= 2")
    if cfg.n_experts_per_tok > cfg.topk_group * (n_experts // cfg.n_group):
        raise ValueError(f"{cfg.name}: top-{cfg.n_experts_per_tok} exceeds the experts in "
                         f"{cfg.topk_group} kept groups")


def route(x: np.ndarray, w_gate: np.ndarray, bias: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """x [N, d], w_gate [E, d], bias [E] -> (idx [N, k] int64, weights [N, k] float64).

    Scores s = sigmoid(fp32 logits) (see gate_logits_fp32). The bias is used only to select: groups are
    ranked by the sum of their top-2 biased scores, the topk_group best kept, the rest masked with -inf
    (not 0.0, which differs when biased scores are negative); then top-k over the biased scores. Ties go
    to the lower group / expert index. Weights are the UNBIASED s[idx], divided by their sum if
    norm_topk_prob (as the DeepSeek reference; HF's +1e-20 is below float64 resolution here), then
    multiplied by routed_scaling. idx is in selection order (best biased score first).
    """
    _check_routing_config(cfg, len(w_gate))
    s = sigmoid(gate_logits_fp32(x, w_gate))  # [N, E]
    biased = s + np.asarray(bias, dtype=np.float64)  # [N, E]
    if cfg.n_group > 1:
        biased = np.where(_group_mask(biased, cfg), biased, -np.inf)
    idx = _topk_lower_index_first(biased, cfg.n_experts_per_tok).astype(np.int64)  # [N, k]
    weights = np.take_along_axis(s, idx, axis=-1)  # [N, k] unbiased
    if cfg.norm_topk_prob:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return idx, weights * cfg.routed_scaling


def swiglu(x: np.ndarray, w1: np.ndarray, w2: np.ndarray, w3: np.ndarray) -> np.ndarray:
    """W2 (silu(W1 x) * W3 x): x [N, d], w1/w3 [m, d], w2 [d, m] -> [N, d]."""
    a = x @ w1.T  # [N, m]
    return (a * sigmoid(a) * (x @ w3.T)) @ w2.T


def routed_experts(x: np.ndarray, idx: np.ndarray, w: np.ndarray, w1: np.ndarray, w2: np.ndarray,
                   w3: np.ndarray) -> np.ndarray:
    """sum_k w[n, k] Expert_{idx[n, k]}(x[n]), [N, d] float64; experts visited in ascending id; expert e's
    weights are w1[e], w2[e], w3[e]."""
    y = np.zeros_like(x, dtype=np.float64)
    for e in np.unique(idx):
        rows, slots = np.nonzero(idx == e)  # tokens routed to expert e and which of their k slots
        y[rows] += w[rows, slots, None] * swiglu(x[rows], w1[e], w2[e], w3[e])
    return y


def moe_forward(weights: dict, cfg: ModelConfig, layer: int, x: np.ndarray) -> np.ndarray:
    """x [N, d] (ffn-normed) -> sum_k w_k Expert_{idx_k}(x) + SharedExpert(x), [N, d]."""
    p = f"layers.{layer}."
    idx, w = route(x, weights[p + "gate"], weights[p + "gate_bias"], cfg)
    w1, w2, w3 = (weights[p + f"experts.{n}"] for n in ("w1", "w2", "w3"))  # [E, mi, d], [E, d, mi], [E, mi, d]
    y = routed_experts(x, idx, w, w1, w2, w3)
    if cfg.n_shared_experts > 0:
        y += swiglu(x, weights[p + "shared.w1"], weights[p + "shared.w2"], weights[p + "shared.w3"])
    return y
