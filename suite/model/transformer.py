"""The target MLA + MoE decoder in torch and its batched latent KV cache.

One forward(tokens [B, T], positions [B, T], cache, past_lens [B], anc) serves prefill (anc None, causal,
naive attention), AR decode (T = 1) and tree verify (anc = ancestor bits; absorbed attention).
float64 on CPU matches references/model.py; bf16 on GPU is the benchmark configuration.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from kdbench.backends import registry
from kdbench.references.model import init_weights as _np_init_weights
from kdbench.references.model_config import ModelConfig

from . import invariant
from .mla import (DEFAULT_OPS, HALF, attention_absorbed, attention_cuda, attention_cuda_absorbed, attention_naive,
                  fused_absorb_runs, inv_freq, invariant_ops, logits_f32, mla_project, split_wkv_b, visible_mask,
                  write_rows)
from .moe import DISPATCH_MODES, moe_forward, swiglu
from .weights import check_weights, from_numpy, init_weights

ATTN_BACKENDS = registry.for_kind("e2e")   # the verify / decode attention follows the stage backend


@dataclass
class LatentCache:
    """kv[layer, b, s] = [rms-normed latent c_kv (dc) | rotated k_pe (dr)] of committed (and, during a
    verify, tree) rows; lengths[b] = committed rows of request b. Zero-filled, so unwritten rows are finite."""
    kv: torch.Tensor       # [layers, B, S_max, dc + dr]
    lengths: torch.Tensor  # [B] int32

    @classmethod
    def allocate(cls, cfg: ModelConfig, batch: int, max_len: int, device, dtype: torch.dtype) -> "LatentCache":
        kv = torch.zeros(cfg.n_layers, batch, max_len, cfg.kv_dim, device=device, dtype=dtype)
        return cls(kv, torch.zeros(batch, dtype=torch.int32, device=device))

    @property
    def max_len(self) -> int:
        return self.kv.shape[2]


class ForwardOut(NamedTuple):
    logits: torch.Tensor      # [B, T, V] (or [B, 1, V] with logit_rows); float32, float64 for a float64 model
    taps: torch.Tensor | None  # [B, T, n_taps * d] residual after each tap layer, ascending layer order


class ForwardContext(NamedTuple):
    """What every attention block of one forward() shares (the tail of _attention's arguments)."""
    positions: torch.Tensor
    cache: LatentCache
    past_lens: torch.Tensor
    visible: torch.Tensor | None   # [B, T, S] bool for the torch attention, None for cuda / invariant
    anc: torch.Tensor | None
    naive: bool                    # causal prefill form (T > 1, no tree)
    attn: str
    S: int                         # keys the torch attention scans


class Transformer:
    """Weights (the references/model.py names) plus the static options of a forward pass."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], *, attn: str = "torch",
                 tap_layers: tuple[int, ...] = (), moe_dispatch: str = "auto", batch_invariant: bool = False):
        check_weights(cfg, weights)
        if attn not in ATTN_BACKENDS:
            raise ValueError(f"attn must be one of {ATTN_BACKENDS}, got {attn!r}")
        if moe_dispatch not in DISPATCH_MODES:
            raise ValueError(f"moe_dispatch must be one of {DISPATCH_MODES}, got {moe_dispatch!r}")
        if attn == "cuda":
            check_cuda_attention(cfg)
        self.cfg, self.w, self.attn, self.moe_dispatch = cfg, weights, attn, moe_dispatch
        # batch_invariant: every op's row output is bitwise independent of the other rows of the call, and
        # prefill, AR decode and tree verify share one attention over logical key order (plans/0010)
        self.batch_invariant = bool(batch_invariant)
        self.route_log: list | None = None   # a list: every MoE layer appends (layer, expert idx) (training)
        self.margin_log: list | None = None  # a list: every MoE layer appends (layer, selection margin [rows])
        self.set_taps(tap_layers)
        self.device, self.dtype = weights["embed"].device, weights["embed"].dtype
        self.freqs = inv_freq(cfg, self.device)  # [dr/2] float64
        self.ops = invariant_ops(self.freqs, cfg.max_seq_len) if self.batch_invariant else DEFAULT_OPS

    @classmethod
    def random(cls, cfg: ModelConfig, seed: int, device="cpu", dtype=torch.bfloat16, **kw) -> "Transformer":
        """Seeded torch init on the device (fast for the real widths)."""
        return cls(cfg, init_weights(cfg, seed, device, dtype), **kw)

    @classmethod
    def from_reference(cls, cfg: ModelConfig, seed: int, device="cpu", dtype=torch.float64, **kw) -> "Transformer":
        """The numpy reference's weights for this seed (identical values; tiny presets)."""
        return cls(cfg, from_numpy(_np_init_weights(cfg, seed), device, dtype), **kw)

    def set_taps(self, tap_layers) -> None:
        """Choose the layers whose residual output forward() returns (the drafter's context features)."""
        bad = [i for i in tap_layers if not 0 <= i < self.cfg.n_layers]
        if bad:
            raise ValueError(f"tap layers {bad} outside [0, {self.cfg.n_layers})")
        self.tap_layers = tuple(int(i) for i in tap_layers)

    def new_cache(self, batch: int, max_len: int) -> LatentCache:
        return LatentCache.allocate(self.cfg, batch, max_len, self.device, self.dtype)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: LatentCache, past_lens: torch.Tensor,
                anc: torch.Tensor | None = None, *, kv_limit: int | None = None,
                logit_rows: torch.Tensor | None = None, attn: str | None = None,
                tap_layers: tuple[int, ...] | None = None) -> ForwardOut:
        """Run T new tokens per request; their cache rows are written at past_lens[b] + t (every layer).

        anc [B, T, W] int64 ancestor bits (tree verify, absorbed attention); None = causal among the new
        rows (T > 1: naive attention, the prefill form; T = 1: absorbed). kv_limit: keys beyond it are
        skipped by the torch attention; it must be >= max(past_lens) + T (default: the whole cache).
        logit_rows [B]: compute logits only at that row of each request (prefill's last prompt token).
        attn / tap_layers override the model's defaults for this call (batch_invariant models always use
        the invariant attention, for every phase).
        """
        fc = self.forward_context(tokens, positions, cache, past_lens, anc, kv_limit=kv_limit, attn=attn)
        tap_layers = self.tap_layers if tap_layers is None else tap_layers
        h = self.w["embed"][tokens]  # [B, T, d] residual stream
        taps = []
        for i in range(self.cfg.n_layers):
            h = self.ffn_block(i, self.attention_block(i, h, fc))
            if i in tap_layers:
                taps.append(h)
        return ForwardOut(self.head(h, logit_rows), torch.cat(taps, dim=-1) if taps else None)

    def forward_context(self, tokens, positions, cache, past_lens, anc=None, *, kv_limit=None, attn=None
                        ) -> "ForwardContext":
        """The per-call constants of forward() (its arguments, the attention form and mask), shared by the
        blocks, so a caller can run or time the blocks one at a time (engine/floor.py)."""
        B, T = tokens.shape
        attn = attn or self.attn
        if attn == "cuda" and cache.kv.dtype != torch.bfloat16 and not self.batch_invariant:
            # refuse: a silent torch fallback would be timed as cuda (the engine picks torch and records it)
            raise ValueError(f"attn='cuda' needs a bfloat16 cache (the tree_verify_mla kernel reads bf16), got "
                             f"{cache.kv.dtype}; use attn='torch'")
        S = cache.max_len if kv_limit is None else min(kv_limit, cache.max_len)
        naive = anc is None and T > 1
        if anc is None and not naive:
            anc = torch.ones(B, 1, 1, dtype=torch.int64, device=tokens.device)
        if self.batch_invariant:
            attn, naive, anc = "invariant", False, None if naive else anc   # prefill: causal key lists
        visible = None if attn in ("cuda", "invariant") and not naive else visible_mask(past_lens, T, S, anc)
        return ForwardContext(positions, cache, past_lens, visible, anc, naive, attn, S)

    def attention_block(self, layer: int, h: torch.Tensor, fc: "ForwardContext") -> torch.Tensor:
        """h + attention(attn_norm(h)) of one layer; writes the layer's new cache rows."""
        x = self.ops.rms_norm(h, self.w[f"layers.{layer}.attn_norm"], self.cfg.rms_eps)
        return h + self._attention(layer, x, *fc)

    def ffn_block(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """h + ffn(ffn_norm(h)): the dense MLP or the MoE layer."""
        return h + self._ffn(layer, self.ops.rms_norm(h, self.w[f"layers.{layer}.ffn_norm"], self.cfg.rms_eps))

    def head(self, h: torch.Tensor, logit_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Final norm and lm_head -> float logits [B, T, V] ([B, 1, V] at logit_rows [B])."""
        B = h.shape[0]
        hidden = self.ops.rms_norm(h, self.w["norm"], self.cfg.rms_eps)
        if logit_rows is not None:
            rows = logit_rows.to(torch.int64).view(B, 1, 1).expand(B, 1, hidden.shape[-1])
            hidden = torch.gather(hidden, 1, rows)  # [B, 1, d]
        return self._lm_head(hidden)

    def _lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] -> [..., V] logits. Half inputs: float32 logits, never rounded to bf16 (mla.logits_f32; the
        batch-invariant mode: its own GEMM with a float32 output). Other dtypes: the plain product."""
        w = self.w["lm_head"]
        if hidden.dtype not in HALF:
            return self.ops.linear(hidden, w)
        if self.batch_invariant:
            return invariant.linear(hidden, w, out_dtype=torch.float32)
        return logits_f32(hidden, w)

    def _attention(self, layer, x, positions, cache, past_lens, visible, anc, naive, attn, S) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        proj = mla_project(w, cfg, layer, x, positions, self.freqs, self.ops)
        write_rows(cache.kv[layer], past_lens, proj.kv_row)
        w_uk, w_uv = split_wkv_b(w, cfg, layer)
        if attn == "invariant":
            return self._attention_invariant(layer, proj, cache.kv[layer], past_lens, anc, w_uk, w_uv)
        if naive:
            o = attention_naive(proj.q_nope, proj.q_pe, cache.kv[layer, :, :S], w_uk, w_uv, cfg, visible)
        elif attn == "cuda" and fused_absorb_runs(proj.q_nope, w_uk, w_uv):
            o = attention_cuda_absorbed(proj.q_nope, proj.q_pe, w_uk, w_uv, cache.kv[layer], past_lens, anc,
                                        cfg.softmax_scale)
        else:
            q_lat = torch.einsum("bthn,hnc->bthc", proj.q_nope, w_uk)  # [B, T, H, dc]
            if attn == "cuda":
                o_lat = attention_cuda(q_lat, proj.q_pe, cache.kv[layer], past_lens, anc, cfg.softmax_scale)
            else:
                o_lat = attention_absorbed(q_lat, proj.q_pe, cache.kv[layer, :, :S], visible, cfg.softmax_scale,
                                           cfg.kv_lora_rank)
            o = torch.einsum("bthc,hvc->bthv", o_lat, w_uv)            # [B, T, H, dv]
        return o.flatten(2) @ w[f"layers.{layer}.wo"].T

    def _attention_invariant(self, layer, proj, kv, past_lens, anc, w_uk, w_uv) -> torch.Tensor:
        """Absorbed MLA with invariant per-head products and the logical-order attention (invariant.py)."""
        B, T, H, dn = proj.q_nope.shape
        q_lat = invariant.head_matmul(proj.q_nope.reshape(B * T, H, dn), w_uk, w_is_kn=True)   # [BT, H, dc]
        o_lat = invariant.attention(q_lat.view(B, T, H, -1), proj.q_pe, kv, past_lens, anc, self.cfg.softmax_scale)
        o = invariant.head_matmul(o_lat.reshape(B * T, H, -1), w_uv, w_is_kn=False)           # [BT, H, dv]
        return invariant.linear(o.reshape(B, T, -1), self.w[f"layers.{layer}.wo"])

    def _ffn(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        if self.cfg.is_moe_layer(layer):
            return moe_forward(self.w, self.cfg, layer, x.reshape(B * T, d), self.moe_dispatch,
                               self.batch_invariant, self.route_log, self.margin_log).view(B, T, d)
        p = f"layers.{layer}.mlp."
        ffn = invariant.swiglu if self.batch_invariant else swiglu
        return ffn(x, self.w[p + "w1"], self.w[p + "w2"], self.w[p + "w3"])


def check_cuda_attention(cfg: ModelConfig) -> None:
    """The tree_verify_mla kernel handles the DeepSeek latent shape only."""
    if (cfg.kv_lora_rank, cfg.qk_rope_dim) != (512, 64):
        raise ValueError(f"{cfg.name}: the cuda attention needs kv_lora_rank 512 and qk_rope_dim 64, got "
                         f"{cfg.kv_lora_rank} and {cfg.qk_rope_dim}; use attn='torch'")

