"""Multi-head latent attention in torch (any dtype): projections, interleaved YaRN RoPE, the latent cache
write, and three attention forms: naive (prefill), absorbed eager ("torch"), absorbed CUDA kernel ("cuda").
Math and names follow references/mla.py (the float64 truth) and shared/notes/mla_moe.md §1.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from kdbench.backends import cuda_ext   # imports no extension: load() builds it on the first cuda call
from kdbench.references.mla import yarn_inv_freq as _np_yarn_inv_freq
from kdbench.references.model_config import ModelConfig

from . import invariant
from . import fused_triton as ft
from . import invariant_triton as tk

HALF = (torch.float16, torch.bfloat16)
# The one-launch Triton norm and RoPE of the default path on a GPU (below); False runs the eager formulas there
# too: reports/h200/forward_profile.py's same-process A/B of whole forwards, nothing else sets it.
FUSED_SMALL_OPS = True
# The kernel path's absorbed products straight into the kernel's query layout and wo's input (attention_cuda_absorbed);
# False: the einsums, their permute copies and the query concatenation. forward_profile.py's A/B switch, as above.
FUSED_ABSORB = True


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Norms, RoPE and softmax run in float32 for half-precision models, natively otherwise."""
    return torch.float32 if dtype in HALF else dtype


def logits_f32(hidden: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Half hidden [..., d] x lm_head w [V, d] -> float32 logits [..., V]: the GEMM's float32 accumulators, never
    rounded to half (plans/0017: bf16 puts logits of ~10 on a 0.0625 grid, whose ties an argmax or a top-k breaks by
    index). CUDA: one GEMM writing float32; CPU: the float32 product of the same half values."""
    h2 = hidden.reshape(-1, hidden.shape[-1])
    y = torch.mm(h2, w.T, out_dtype=torch.float32) if h2.is_cuda else h2.float() @ w.float().T
    return y.reshape(*hidden.shape[:-1], w.shape[0])


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * w over the last axis, in compute_dtype, returned in x's dtype. Half-precision CUDA tensors
    outside autograd take one Triton launch per call (invariant_triton.rms_norm: the same float32 formula, one
    program per row) instead of ~9 elementwise and reduction kernels; s11's AR forward profile spent ~0.15 ms of
    1.43 ms in them at batch 1 (plans/0003, "Forward floors")."""
    if _fused_norm_runs(x, w):
        return tk.rms_norm(x, w, eps)
    xc = x.to(compute_dtype(x.dtype))
    y = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps) * w.to(xc.dtype)
    return y.to(x.dtype)


def _wants_grad(*ts: torch.Tensor) -> bool:
    """Autograd would need a backward through one of ts: the fused forms (no backward) must not run."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def _fused_small_op(x: torch.Tensor, available: bool, *grads: torch.Tensor) -> bool:
    """What both one-launch ops need: switched on, Triton available, a half-precision CUDA x with the last stride 1,
    and no gradient wanted through x or `grads` (the kernels have no backward)."""
    return (FUSED_SMALL_OPS and available and x.is_cuda and x.dtype in HALF and x.stride(-1) == 1
            and not _wants_grad(x, *grads))


def _fused_norm_runs(x: torch.Tensor, w: torch.Tensor) -> bool:
    """The Triton norm holds a row in registers: rows up to 16384 wide."""
    return (_fused_small_op(x, tk.AVAILABLE, w) and w.is_contiguous() and w.dim() == 1
            and x.shape[-1] == w.shape[0] <= 16384)


def inv_freq(cfg: ModelConfig, device) -> torch.Tensor:
    """[dr/2] float64 rotation frequencies, the reference's YaRN formula (config constants, not data)."""
    return torch.from_numpy(_np_yarn_inv_freq(cfg)).to(device)


def rope_interleaved(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) by positions * freqs[i].

    x [B, T, ..., dr]; positions [B, T] int; freqs [dr/2] float64. Angles are float64 (exact enough at
    131K positions); the rotation runs in compute_dtype.
    """
    if _fused_rope_runs(x, positions, freqs):
        return ft.rope(x, positions, freqs)     # one launch (fused_triton.py) instead of ~15 elementwise kernels
    angle = positions.to(torch.float64)[..., None] * freqs  # [B, T, dr/2] radians
    return _rotate(x, torch.cos(angle), torch.sin(angle))


def _fused_rope_runs(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor) -> bool:
    """The Triton RoPE: x [B, T, (H,) dr], float64 frequencies and int positions on x's device."""
    return (_fused_small_op(x, ft.AVAILABLE) and x.dim() in (3, 4) and x.shape[-1] % 2 == 0
            and freqs.dtype == torch.float64 and freqs.is_contiguous() and freqs.numel() == x.shape[-1] // 2
            and tuple(positions.shape) == tuple(x.shape[:2]) and positions.dtype in (torch.int32, torch.int64)
            and freqs.device == x.device == positions.device)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, ..., dr]; cos / sin [B, T, dr/2] float64 -> the rotated pairs in x's dtype."""
    shape = cos.shape[:2] + (1,) * (x.dim() - 3) + cos.shape[-1:]
    cd = compute_dtype(x.dtype)
    cos, sin = cos.reshape(shape).to(cd), sin.reshape(shape).to(cd)
    xc = x.to(cd)
    x0, x1 = xc[..., 0::2], xc[..., 1::2]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)  # [..., dr/2, 2]
    return out.flatten(-2).to(x.dtype)


class RopeTable:
    """Rotation by a cos / sin table of every position [0, max_len) computed once, so a position's rotation
    never depends on the call it is in (torch's CPU transcendentals round by position in the buffer)."""

    def __init__(self, freqs: torch.Tensor, max_len: int):
        angle = torch.arange(max_len, device=freqs.device, dtype=torch.float64)[:, None] * freqs  # [P, dr/2]
        self.cos, self.sin = torch.cos(angle), torch.sin(angle)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        del freqs  # in the table
        p = positions.to(torch.int64)
        return _rotate(x, self.cos[p], self.sin[p])


class LinearOps(NamedTuple):
    """The GEMM, norm and RoPE a projection uses: cuBLAS / torch reductions, or their batch-invariant forms."""
    linear: Callable     # (x [..., K], w [N, K]) -> [..., N]
    rms_norm: Callable   # (x, w, eps) -> x's shape and dtype
    rope: Callable       # (x, positions, freqs) -> x rotated


DEFAULT_OPS = LinearOps(lambda x, w: x @ w.T, rms_norm, rope_interleaved)


def invariant_ops(freqs: torch.Tensor, max_len: int) -> LinearOps:
    return LinearOps(invariant.linear, invariant.rms_norm, RopeTable(freqs, max_len))


class Projected(NamedTuple):
    q_nope: torch.Tensor  # [B, T, H, dn]
    q_pe: torch.Tensor    # [B, T, H, dr] rotated
    kv_row: torch.Tensor  # [B, T, dc + dr] = [rms-normed latent | rotated k_pe], what the cache holds


def mla_project(w: dict, cfg: ModelConfig, layer: int, h: torch.Tensor, positions: torch.Tensor,
                freqs: torch.Tensor, ops: LinearOps = DEFAULT_OPS) -> Projected:
    """h [B, T, d] (attn-normed) -> queries and the new cache rows."""
    p = f"layers.{layer}."
    B, T, _ = h.shape
    if cfg.q_lora_rank > 0:
        q = ops.linear(ops.rms_norm(ops.linear(h, w[p + "wq_a"]), w[p + "q_norm"], cfg.rms_eps), w[p + "wq_b"])
    else:
        q = ops.linear(h, w[p + "wq"])
    q = q.view(B, T, cfg.n_heads, cfg.qk_head_dim)  # [B, T, H, dn + dr]
    kv = ops.linear(h, w[p + "wkv_a"])  # [B, T, dc + dr]
    c_kv = ops.rms_norm(kv[..., :cfg.kv_lora_rank], w[p + "kv_norm"], cfg.rms_eps)  # norm on the latent only
    k_pe = ops.rope(kv[..., cfg.kv_lora_rank:], positions, freqs)
    return Projected(q[..., :cfg.qk_nope_dim], ops.rope(q[..., cfg.qk_nope_dim:], positions, freqs),
                     torch.cat((c_kv, k_pe), dim=-1))


def split_wkv_b(w: dict, cfg: ModelConfig, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """wkv_b [H*(dn+dv), dc] -> views W_UK [H, dn, dc], W_UV [H, dv, dc]."""
    wkv = w[f"layers.{layer}.wkv_b"].view(cfg.n_heads, cfg.qk_nope_dim + cfg.v_head_dim, cfg.kv_lora_rank)
    return wkv[:, :cfg.qk_nope_dim], wkv[:, cfg.qk_nope_dim:]


def write_rows(cache_layer: torch.Tensor, past_lens: torch.Tensor, rows: torch.Tensor) -> None:
    """cache_layer [B, S, D]; rows [B, T, D] go to slots past_lens[b] + t (index_put: no host sync)."""
    B, T, _ = rows.shape
    slot = past_lens.to(torch.int64)[:, None] + torch.arange(T, device=rows.device)  # [B, T]
    bidx = torch.arange(B, device=rows.device)[:, None].expand(B, T)
    cache_layer[bidx, slot] = rows.to(cache_layer.dtype)


def visible_mask(past_lens: torch.Tensor, T: int, S: int, anc: torch.Tensor | None) -> torch.Tensor:
    """[B, T, S] bool. Key j is visible to new row t iff j < past_len, or j = past_len + i with
    i <= t (anc None: causal) or bit i % 64 of anc[b, t, i // 64] set (ancestor-or-self)."""
    dev = past_lens.device
    rel = torch.arange(S, device=dev)[None, :] - past_lens.to(torch.int64)[:, None]  # [B, S]
    if anc is None:
        t = torch.arange(T, device=dev)[None, :, None]
        return rel[:, None, :] <= t
    in_tree = (rel >= 0) & (rel < T)                                      # [B, S]
    relc = rel.clamp(0, T - 1)
    word = (relc // 64)[:, None, :].expand(-1, T, -1)                     # [B, T, S]
    bits = torch.gather(anc, 2, word) >> (relc % 64)[:, None, :]
    return (rel < 0)[:, None, :] | (in_tree[:, None, :] & (bits & 1).bool())


def zero_unseen(kv: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """kv [B, S, D] with the rows no query sees (visible [B, T, S]) zeroed, so 0 * NaN never reaches an output."""
    return kv.masked_fill(~visible.any(dim=1)[..., None], 0.0)


def _softmax_rows(scores: torch.Tensor, scale: float, visible: torch.Tensor) -> torch.Tensor:
    """scores [B, T, H, S] (unscaled) -> softmax(scale * scores) in compute_dtype, 0 where not visible."""
    s = (scores.to(compute_dtype(scores.dtype)) * scale).masked_fill(~visible[:, :, None, :], float("-inf"))
    return torch.softmax(s, dim=-1)


def attention_naive(q_nope, q_pe, kv, w_uk, w_uv, cfg: ModelConfig, visible) -> torch.Tensor:
    """Per-head K/V from the latent. kv [B, S, dc+dr]; visible [B, T, S]. Returns o [B, T, H, dv]."""
    kv = zero_unseen(kv, visible)
    c_kv, k_pe = kv[..., :cfg.kv_lora_rank], kv[..., cfg.kv_lora_rank:]
    k_nope = torch.einsum("bsc,hnc->bshn", c_kv, w_uk)  # [B, S, H, dn]
    v = torch.einsum("bsc,hvc->bshv", c_kv, w_uv)       # [B, S, H, dv]
    scores = torch.einsum("bthn,bshn->bths", q_nope, k_nope) + torch.einsum("bthr,bsr->bths", q_pe, k_pe)
    p = _softmax_rows(scores, cfg.softmax_scale, visible).to(v.dtype)
    return torch.einsum("bths,bshv->bthv", p, v)


def attention_absorbed(q_lat, q_pe, kv, visible, scale: float, dc: int) -> torch.Tensor:
    """MQA over the shared key [c_kv | k_pe] and value c_kv. q_lat [B,T,H,dc]; returns o_lat [B,T,H,dc]."""
    kv = zero_unseen(kv, visible)
    q = torch.cat((q_lat, q_pe), dim=-1).flatten(1, 2)         # [B, T*H, dc+dr]
    scores = torch.bmm(q, kv.transpose(1, 2)).unflatten(1, (q_lat.shape[1], q_lat.shape[2]))  # [B,T,H,S]
    p = _softmax_rows(scores, scale, visible).to(kv.dtype)
    return torch.bmm(p.flatten(1, 2), kv[..., :dc]).view(q_lat.shape)


def attention_cuda(q_lat, q_pe, kv, past_lens, anc, scale: float) -> torch.Tensor:
    """The tree_verify_mla kernel (dc = 512, dr = 64, bf16): keys [0, past_len + T) of kv [B, S, 576]."""
    q = torch.cat((q_lat, q_pe), dim=-1).to(torch.bfloat16).contiguous()  # [B, T, H, 576]
    o_lat, _lse = cuda_ext.tree_verify_mla(q, kv, past_lens.to(torch.int32), anc, scale)
    return o_lat.to(q_lat.dtype)


def absorb_into(q_nope: torch.Tensor, w_uk: torch.Tensor, q: torch.Tensor) -> None:
    """q[..., :dc] = q_nope W_UK per head as one strided batched GEMM that writes the [B, T, H, dc + dr] query
    buffer in place (no permute copy in or out, no concatenation): q_nope [B, T, H, dn] (last stride 1), w_uk
    [H, dn, dc], q [B, T, H, dc + dr] contiguous, all one dtype."""
    B, T, H, dn = q_nope.shape
    dc = w_uk.shape[-1]
    out = q.view(B * T, H, q.shape[-1])[..., :dc].transpose(0, 1)                      # [H, BT, dc], row stride H(dc+dr)
    torch.bmm(q_nope.reshape(B * T, H, dn).transpose(0, 1), w_uk, out=out)


def unabsorb(o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """o_lat [B, T, H, dc] contiguous, w_uv [H, dv, dc] -> o [B, T, H * dv], the per-head o_lat W_UV^T written
    in the layout wo reads by one strided batched GEMM (einsum's permutes copy o_lat in and o out)."""
    B, T, H, dc = o_lat.shape
    dv = w_uv.shape[1]
    o = torch.empty(B * T, H, dv, dtype=o_lat.dtype, device=o_lat.device)
    torch.bmm(o_lat.view(B * T, H, dc).transpose(0, 1), w_uv.transpose(1, 2), out=o.transpose(0, 1))
    return o.view(B, T, H * dv)


def attention_cuda_absorbed(q_nope, q_pe, w_uk, w_uv, kv, past_lens, anc, scale: float) -> torch.Tensor:
    """The kernel path end to end for a bf16 model: q_nope [B, T, H, dn], q_pe [B, T, H, dr] (rotated), w_uk
    [H, dn, dc], w_uv [H, dv, dc], kv [B, S, dc + dr] -> o [B, T, H * dv], wo's input. Same products as
    einsum -> attention_cuda -> einsum, less the layout copies (s12: plans/0003 "Forward floors")."""
    B, T, H, _ = q_nope.shape
    dc = w_uk.shape[-1]
    q = torch.empty(B, T, H, dc + q_pe.shape[-1], dtype=torch.bfloat16, device=q_nope.device)
    absorb_into(q_nope, w_uk, q)
    q[..., dc:].copy_(q_pe)
    o_lat, _lse = cuda_ext.tree_verify_mla(q, kv, past_lens.to(torch.int32), anc, scale)
    return unabsorb(o_lat, w_uv)


def fused_absorb_runs(q_nope: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor) -> bool:
    """attention_cuda_absorbed's GEMMs write bf16 in place (bmm out= has no autograd): a bf16 model, switched on,
    no gradient wanted (the kernel has no backward either)."""
    return (FUSED_ABSORB and q_nope.dtype == w_uk.dtype == w_uv.dtype == torch.bfloat16 and q_nope.stride(-1) == 1
            and not _wants_grad(q_nope, w_uk, w_uv))
