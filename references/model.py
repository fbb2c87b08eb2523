"""The full MLA + MoE decoder in numpy float64: weight init (names are the checkpoint contract), the latent
KV cache, and forward / prefill / decode / tree_verify. Attention is the absorbed form (as decode runs).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .mla import (absorb_q, attention_absorbed, attention_naive, heads_output, mla_output, mla_project,
                  rms_norm)
from .model_config import ModelConfig
from .moe import moe_forward, swiglu

NORM_NOISE = 0.05  # norm weights are 1 + NORM_NOISE * N(0, 1), so a transposed norm cannot pass tests
GATE_BIAS_STD = 0.1  # comparable to the gaps between sorted sigmoid scores, so the bias changes routing


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight name and shape, in the order init_weights draws them."""
    d, h, dc, dr = cfg.hidden, cfg.n_heads, cfg.kv_lora_rank, cfg.qk_rope_dim
    shapes: dict[str, tuple[int, ...]] = {"embed": (cfg.vocab_size, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm"] = (d,)
        shapes[p + "ffn_norm"] = (d,)
        if cfg.q_lora_rank > 0:
            shapes[p + "wq_a"] = (cfg.q_lora_rank, d)
            shapes[p + "q_norm"] = (cfg.q_lora_rank,)
            shapes[p + "wq_b"] = (h * cfg.qk_head_dim, cfg.q_lora_rank)
        else:
            shapes[p + "wq"] = (h * cfg.qk_head_dim, d)
        shapes[p + "wkv_a"] = (dc + dr, d)
        shapes[p + "kv_norm"] = (dc,)
        shapes[p + "wkv_b"] = (h * (cfg.qk_nope_dim + cfg.v_head_dim), dc)
        shapes[p + "wo"] = (d, h * cfg.v_head_dim)
        shapes.update(_ffn_shapes(cfg, i))
    shapes["norm"] = (d,)
    shapes["lm_head"] = (cfg.vocab_size, d)
    return shapes


def _ffn_shapes(cfg: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    p, d = f"layers.{layer}.", cfg.hidden
    if not cfg.is_moe_layer(layer):
        m = cfg.intermediate
        return {p + "mlp.w1": (m, d), p + "mlp.w2": (d, m), p + "mlp.w3": (m, d)}
    e, mi, ms = cfg.n_routed_experts, cfg.moe_intermediate, cfg.n_shared_experts * cfg.moe_intermediate
    shapes = {p + "gate": (e, d), p + "gate_bias": (e,),
              p + "experts.w1": (e, mi, d), p + "experts.w2": (e, d, mi), p + "experts.w3": (e, mi, d)}
    if ms > 0:
        shapes.update({p + "shared.w1": (ms, d), p + "shared.w2": (d, ms), p + "shared.w3": (ms, d)})
    return shapes


def init_weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Deterministic float64 weights from np.random.default_rng(seed), drawn in weight_shapes order.

    Matrices: N(0, 1/fan_in) with fan_in = the last axis; embed: N(0, 1) (a one-hot input has fan-in 1);
    norms: 1 + small noise; gate_bias: N(0, GATE_BIAS_STD^2).
    """
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in weight_shapes(cfg).items():
        z = rng.standard_normal(shape)
        if name == "embed":
            weights[name] = z
        elif name.endswith("norm"):
            weights[name] = 1.0 + NORM_NOISE * z
        elif name.endswith("gate_bias"):
            weights[name] = GATE_BIAS_STD * z
        else:
            weights[name] = z / np.sqrt(shape[-1])
    return weights


@dataclass
class LatentCache:
    """Per layer the normalized latent c_kv [S, dc] and rotated k_pe [S, dr]; length = rows in every layer."""
    c_kv: list[np.ndarray]
    k_pe: list[np.ndarray]
    length: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig) -> "LatentCache":
        return cls(c_kv=[np.zeros((0, cfg.kv_lora_rank)) for _ in range(cfg.n_layers)],
                   k_pe=[np.zeros((0, cfg.qk_rope_dim)) for _ in range(cfg.n_layers)])

    def append(self, layer: int, c_kv: np.ndarray, k_pe: np.ndarray) -> None:
        """Append rows to one layer; length becomes the row count every layer has reached."""
        self.c_kv[layer] = np.concatenate([self.c_kv[layer], c_kv])
        self.k_pe[layer] = np.concatenate([self.k_pe[layer], k_pe])
        self.length = min(len(c) for c in self.c_kv)

    def copy(self) -> "LatentCache":
        return LatentCache([c.copy() for c in self.c_kv], [k.copy() for k in self.k_pe], self.length)


@dataclass(frozen=True)
class ForwardOut:
    logits: np.ndarray         # [T, V]
    hidden: np.ndarray         # [T, d] after the final norm
    layer_outputs: np.ndarray  # [n_layers, T, d] residual stream after each layer, before the final norm


def _visibility(past: int, t: int, tree_visible: np.ndarray | None) -> np.ndarray:
    """[T, past + T] bool: all cached rows, then causal (None) or tree_visible among the new rows."""
    new = np.tril(np.ones((t, t), dtype=bool)) if tree_visible is None else np.asarray(tree_visible, dtype=bool)
    if new.shape != (t, t):
        raise ValueError(f"tree_visible must be [{t}, {t}], got {new.shape}")
    if not new.diagonal().all():
        # Every real row sees itself; all-False padding rows belong to tree_verify_mla's batched interface.
        raise ValueError(f"tree_visible rows {np.flatnonzero(~new.diagonal()).tolist()} do not see themselves")
    return np.concatenate([np.ones((t, past), dtype=bool), new], axis=1)


def _attention(weights: dict, cfg: ModelConfig, layer: int, x: np.ndarray, *, positions: np.ndarray,
               cache: LatentCache, visible: np.ndarray, mode: str) -> np.ndarray:
    """x [T, d] attn-normed -> [T, d]; appends the T new latent rows of this layer to cache first."""
    proj = mla_project(weights, cfg, layer, x, positions)
    cache.append(layer, proj["c_kv"], proj["k_pe"])
    c_kv, k_pe = cache.c_kv[layer], cache.k_pe[layer]  # [past + T, dc], [past + T, dr]
    if mode == "naive":
        o, _ = attention_naive(proj["q_nope"], proj["q_pe"], c_kv, k_pe, weights[f"layers.{layer}.wkv_b"],
                               cfg, visible)
        return heads_output(weights, layer, o)
    q_lat = absorb_q(weights, cfg, layer, proj["q_nope"])
    o_lat, _ = attention_absorbed(q_lat, proj["q_pe"], c_kv, k_pe, visible, cfg.softmax_scale)
    return mla_output(weights, cfg, layer, o_lat)


def ffn(weights: dict, cfg: ModelConfig, layer: int, x: np.ndarray) -> np.ndarray:
    """Dense SwiGLU for the first n_dense_layers, MoE (routed + shared) after."""
    if cfg.is_moe_layer(layer):
        return moe_forward(weights, cfg, layer, x)
    p = f"layers.{layer}.mlp."
    return swiglu(x, weights[p + "w1"], weights[p + "w2"], weights[p + "w3"])


def forward(weights: dict, cfg: ModelConfig, tokens, positions, cache: LatentCache,
            tree_visible=None, *, attention: str = "absorbed") -> ForwardOut:
    """Run T new tokens at the given positions over the cache, appending their rows (all layers).

    Row t sees cached rows [0, past) and new row j iff tree_visible[t, j] (None = causal).
    attention="naive" uses the per-head MHA form instead (tests prove both equal).
    """
    if attention not in ("absorbed", "naive"):
        raise ValueError(f"attention must be 'absorbed' or 'naive', got {attention!r}")
    tokens, positions = np.asarray(tokens, dtype=np.int64), np.asarray(positions, dtype=np.int64)
    visible = _visibility(cache.length, len(tokens), tree_visible)  # [T, past + T]
    h = weights["embed"][tokens]  # [T, d] residual stream
    layer_outputs = []
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        x = rms_norm(h, weights[p + "attn_norm"], cfg.rms_eps)
        h = h + _attention(weights, cfg, i, x, positions=positions, cache=cache, visible=visible, mode=attention)
        h = h + ffn(weights, cfg, i, rms_norm(h, weights[p + "ffn_norm"], cfg.rms_eps))
        layer_outputs.append(h)
    hidden = rms_norm(h, weights["norm"], cfg.rms_eps)
    return ForwardOut(logits=hidden @ weights["lm_head"].T, hidden=hidden, layer_outputs=np.stack(layer_outputs))


def prefill(weights: dict, cfg: ModelConfig, tokens) -> tuple[ForwardOut, LatentCache]:
    """Causal forward of tokens at positions 0..T-1 into a fresh cache."""
    cache = LatentCache.empty(cfg)
    out = forward(weights, cfg, tokens, np.arange(len(tokens)), cache)
    return out, cache


def decode(weights: dict, cfg: ModelConfig, token: int, cache: LatentCache) -> ForwardOut:
    """One token at position cache.length."""
    return forward(weights, cfg, [token], [cache.length], cache)


def tree_verify(weights: dict, cfg: ModelConfig, tokens, depths, visible, cache: LatentCache) -> ForwardOut:
    """The n+1 flattened tree rows (root first) at positions cache.length + depths, under visible [n+1, n+1]."""
    positions = cache.length + np.asarray(depths, dtype=np.int64)
    return forward(weights, cfg, tokens, positions, cache, tree_visible=visible)
