"""Multi-head latent attention (DeepSeek-V3 / Kimi K2) in numpy float64: norms, YaRN RoPE, projections,
and both attention forms (naive per-head K/V, absorbed latent MQA) under an explicit visibility mask.

Equations and names follow shared/notes/mla_moe.md §1; weight names follow references/model.py.
"""
from __future__ import annotations

import math

import numpy as np

from .model_config import ModelConfig


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / rms(x) * w over the last axis."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


# ----------------------------------------------------------------------------------------------- RoPE

def _yarn_correction_dim(n_rotations: float, cfg: ModelConfig) -> float:
    """The rope dim whose wavelength makes n_rotations turns over original_max_pos tokens."""
    dr = cfg.qk_rope_dim
    return dr * math.log(cfg.original_max_pos / (n_rotations * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))


def yarn_correction_range(cfg: ModelConfig) -> tuple[int, int]:
    """(low, high) pair indices of the YaRN ramp: floor(corr(beta_fast)), ceil(corr(beta_slow)), clamped."""
    low = math.floor(_yarn_correction_dim(cfg.beta_fast, cfg))
    high = math.ceil(_yarn_correction_dim(cfg.beta_slow, cfg))
    return max(low, 0), min(high, cfg.qk_rope_dim - 1)


def yarn_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """[dr/2] rotation frequencies (radians per position): theta^(-2i/dr), YaRN-corrected if rope_factor > 1.

    Pairs below `low` (high frequency) keep theta^(-2i/dr); pairs above `high` are divided by the factor;
    a linear ramp in between. YaRN is applied whenever rope_factor > 1 (HF convention, as softmax_scale).
    """
    if cfg.mscale != cfg.mscale_all_dim:
        # HF would scale cos/sin by mscale(factor, mscale) / mscale(factor, mscale_all_dim) != 1 (V2-Lite);
        # no preset needs it, so refuse instead of silently diverging from such a checkpoint.
        raise ValueError(f"{cfg.name}: mscale {cfg.mscale} != mscale_all_dim {cfg.mscale_all_dim} "
                         "(a rope cos/sin attenuation) is not implemented")
    dr = cfg.qk_rope_dim
    inv_freq = cfg.rope_theta ** (-np.arange(0, dr, 2, dtype=np.float64) / dr)  # [dr/2]
    if not cfg.yarn_enabled:
        return inv_freq
    low, high = yarn_correction_range(cfg)
    span = (high - low) if high != low else 0.001
    ramp = np.clip((np.arange(dr // 2, dtype=np.float64) - low) / span, 0.0, 1.0)  # 0 = keep, 1 = divide
    return inv_freq / cfg.rope_factor * ramp + inv_freq * (1.0 - ramp)


def rope_interleaved(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate adjacent pairs (x[2i], x[2i+1]) by angle position * inv_freq[i] (GPT-J / complex-view style).

    x [..., dr]; positions has the leading shape of x (or a prefix of it, e.g. [T] for x [T, H, dr]).
    """
    x = np.asarray(x, dtype=np.float64)
    pos = np.asarray(positions, dtype=np.float64)
    pos = pos.reshape(pos.shape + (1,) * (x.ndim - 1 - pos.ndim))
    angle = pos[..., None] * inv_freq  # [..., dr/2] radians
    cos, sin = np.cos(angle), np.sin(angle)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


# ----------------------------------------------------------------------------------------- projections

def split_wkv_b(weights: dict, cfg: ModelConfig, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """wkv_b [H*(dn+dv), dc] -> (W_UK [H, dn, dc], W_UV [H, dv, dc]); per head dn rows of W_UK then dv of W_UV."""
    w = weights[f"layers.{layer}.wkv_b"].reshape(cfg.n_heads, cfg.qk_nope_dim + cfg.v_head_dim, cfg.kv_lora_rank)
    return w[:, :cfg.qk_nope_dim], w[:, cfg.qk_nope_dim:]


def mla_project(weights: dict, cfg: ModelConfig, layer: int, h: np.ndarray, positions: np.ndarray) -> dict:
    """h [T, d] (already attn-normed) -> q_nope [T,H,dn], q_pe [T,H,dr] rotated, c_kv [T,dc] normed, k_pe [T,dr] rotated."""
    p = f"layers.{layer}."
    if cfg.q_lora_rank > 0:
        c_q = rms_norm(h @ weights[p + "wq_a"].T, weights[p + "q_norm"], cfg.rms_eps)  # [T, q_lora]
        q = c_q @ weights[p + "wq_b"].T  # [T, H*(dn+dr)]
    else:
        q = h @ weights[p + "wq"].T
    q = q.reshape(len(h), cfg.n_heads, cfg.qk_head_dim)  # [T, H, dn+dr]
    kv = h @ weights[p + "wkv_a"].T  # [T, dc+dr]
    inv_freq = yarn_inv_freq(cfg)
    return dict(
        q_nope=q[..., :cfg.qk_nope_dim],
        q_pe=rope_interleaved(q[..., cfg.qk_nope_dim:], positions, inv_freq),
        c_kv=rms_norm(kv[:, :cfg.kv_lora_rank], weights[p + "kv_norm"], cfg.rms_eps),  # norm on the latent only
        k_pe=rope_interleaved(kv[:, cfg.kv_lora_rank:], positions, inv_freq),
    )


def absorb_q(weights: dict, cfg: ModelConfig, layer: int, q_nope: np.ndarray) -> np.ndarray:
    """q_lat[t, h] = W_UK[h]^T q_nope[t, h]: [T, H, dn] -> [T, H, dc]."""
    w_uk, _ = split_wkv_b(weights, cfg, layer)
    return np.einsum("thn,hnc->thc", q_nope, w_uk)


def mla_output(weights: dict, cfg: ModelConfig, layer: int, o_lat: np.ndarray) -> np.ndarray:
    """o_lat [T, H, dc] -> W_UV per head [T, H, dv] -> wo -> [T, d]."""
    _, w_uv = split_wkv_b(weights, cfg, layer)
    return heads_output(weights, layer, np.einsum("thc,hvc->thv", o_lat, w_uv))


def heads_output(weights: dict, layer: int, o: np.ndarray) -> np.ndarray:
    """Per-head values o [T, H, dv] -> wo -> [T, d] (the naive path's output projection)."""
    return o.reshape(len(o), -1) @ weights[f"layers.{layer}.wo"].T


# ------------------------------------------------------------------------------------------- attention

def masked_softmax(logits: np.ndarray, visible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over the last axis of logits [T, H, S] (already scaled) where visible [T, S].

    Returns (p [T, H, S], lse [T, H]) with lse = ln sum_visible exp(logit). A row with nothing visible gives
    p = 0 and lse = -inf; invisible logits are replaced by select (never multiplied), so NaN there is harmless.
    """
    z = np.where(visible[:, None, :], logits, -np.inf)  # [T, H, S]
    m = z.max(axis=-1, keepdims=True)  # [T, H, 1]
    m = np.where(np.isfinite(m), m, 0.0)  # empty rows: exp(-inf - 0) = 0, no inf - inf
    e = np.exp(z - m)
    s = e.sum(axis=-1, keepdims=True)
    nonempty = s > 0
    p = e / np.where(nonempty, s, 1.0)
    lse = np.where(nonempty, m + np.log(np.where(nonempty, s, 1.0)), -np.inf)
    return p, lse[..., 0]


def _zero_unseen(x: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """Zero the key rows of x [S, ...] that no query row sees, so 0 * NaN never reaches an output."""
    seen = visible.any(axis=0).reshape((-1,) + (1,) * (x.ndim - 1))
    return np.where(seen, x, 0.0)


def attention_naive(q_nope, q_pe, c_kv, k_pe, w_ukv, cfg: ModelConfig, visible) -> tuple[np.ndarray, np.ndarray]:
    """MHA form: materialize k_nope, v per head from the latent, then softmax(scale * q.k) v.

    q_nope [T,H,dn], q_pe [T,H,dr], c_kv [S,dc], k_pe [S,dr], w_ukv = wkv_b [H*(dn+dv), dc], visible [T,S].
    Returns (o [T, H, dv], lse [T, H]).
    """
    c_kv, k_pe = _zero_unseen(c_kv, visible), _zero_unseen(k_pe, visible)
    w = np.asarray(w_ukv).reshape(cfg.n_heads, cfg.qk_nope_dim + cfg.v_head_dim, cfg.kv_lora_rank)
    k_nope = np.einsum("sc,hnc->shn", c_kv, w[:, :cfg.qk_nope_dim])  # [S, H, dn]
    v = np.einsum("sc,hvc->shv", c_kv, w[:, cfg.qk_nope_dim:])  # [S, H, dv]
    logits = np.einsum("thn,shn->ths", q_nope, k_nope) + np.einsum("thr,sr->ths", q_pe, k_pe)  # [T, H, S]
    p, lse = masked_softmax(cfg.softmax_scale * logits, visible)
    return np.einsum("ths,shv->thv", p, v), lse


def attention_absorbed(q_lat, q_pe, c_kv, k_pe, visible, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """MQA form: one shared key [c_kv | k_pe] and value c_kv for all heads.

    q_lat [T,H,dc], q_pe [T,H,dr], c_kv [S,dc], k_pe [S,dr], visible [T,S]. Returns (o_lat [T,H,dc], lse [T,H]).
    """
    c_kv, k_pe = _zero_unseen(c_kv, visible), _zero_unseen(k_pe, visible)
    logits = q_lat @ c_kv.T + q_pe @ k_pe.T  # [T, H, S]; matmul (BLAS), not einsum: ~10x faster at 576 wide
    p, lse = masked_softmax(scale * logits, visible)
    return p @ c_kv, lse
