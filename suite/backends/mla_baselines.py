"""torch baselines for tree_verify_mla (the kernel's competitors, measured in the same process).

All take the kernel's inputs: q [B,T,H,dc+dr], kv [B,S,dc+dr], past_lens [B] int32, anc [B,T,W] int64,
scale; all return (o_lat [B,T,H,dc], lse [B,T,H] float32).
- eager:   cuBLAS matmuls (fp32 scores) + a boolean-masked softmax in fp32 (a plain torch model)
- sdpa:    torch.nn.functional.scaled_dot_product_attention with the boolean mask (V = the latent)
- twopass: the prefix without a mask + the tree block with the mask, merged by LSE (the cascade)
"""
from __future__ import annotations

import torch

from kdbench.backends.masks import anc_to_bool, visible_mask


def _scores(q, k):
    """q @ k^T with fp32 output: bf16 operands, fp32 accumulation and result (torch.bmm out_dtype on CUDA;
    elsewhere the product is upcast). Rounding raw scores to bf16 would cost the baseline its accuracy."""
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        return torch.bmm(q, k, out_dtype=torch.float32)
    return torch.bmm(q, k).float()


def eager(q, kv, past_lens, anc, scale, dc: int = 512):
    return masked_attention(q, kv, visible_mask(past_lens, anc, q.shape[1], kv.shape[1]), scale, dc)


def sdpa(q, kv, past_lens, anc, scale, dc: int = 512):
    b, t, h, _ = q.shape
    vis = visible_mask(past_lens, anc, t, kv.shape[1])                  # [B, T, S]
    qf = q.reshape(b, 1, t * h, -1)
    k = kv.unsqueeze(1)                                                 # [B, 1, S, 576]
    v = kv[..., :dc].nan_to_num(0.0).unsqueeze(1)                       # [B, 1, S, dc]
    mask = vis.repeat_interleave(h, dim=1).unsqueeze(1)                 # [B, 1, T*H, S]
    o = torch.nn.functional.scaled_dot_product_attention(qf, k.nan_to_num(0.0), v, attn_mask=mask, scale=scale)
    return o.reshape(b, t, h, dc).nan_to_num(0.0), None


def twopass(q, kv, past_lens, anc, scale, dc: int = 512):
    """Pass 1: every row over the committed prefix (no mask beyond the ragged length); pass 2: the tree block
    under the ancestor mask; merge o = (e^{l1} o1 + e^{l2} o2) / (e^{l1} + e^{l2}) with l = lse."""
    b, t, h, _ = q.shape
    s_len = kv.shape[1]
    cols = torch.arange(s_len, device=kv.device)
    prefix = (cols[None, :] < past_lens[:, None].long())                # [B, S]
    real = anc_to_bool(anc, t).any(-1)                                  # [B, T]: padding rows see nothing
    idx = past_lens[:, None].long() + torch.arange(t, device=kv.device)[None, :]   # [B, T]
    tree_kv = torch.gather(kv, 1, idx[..., None].expand(b, t, kv.shape[-1]))        # [B, T, 576]
    o1, l1 = masked_attention(q, kv, prefix[:, None, :] & real[..., None], scale, dc)
    o2, l2 = masked_attention(q, tree_kv, anc_to_bool(anc, t), scale, dc)
    m = torch.maximum(l1, l2)
    w1 = torch.exp(l1 - m).nan_to_num(0.0)
    w2 = torch.exp(l2 - m).nan_to_num(0.0)
    den = (w1 + w2).clamp_min(1e-30)
    o = (o1.float() * w1[..., None] + o2.float() * w2[..., None]) / den[..., None]
    return o.to(q.dtype), m + torch.log(w1 + w2)


def masked_attention(q, kv, vis, scale, dc):
    """Attention of every (node, head) row over kv under vis [B, T, S]; NaN in kv rows nobody sees is masked
    to -inf in the scores and zeroed in the values (0 * NaN must not reach an output)."""
    b, t, h, _ = q.shape
    qf = q.reshape(b, t * h, -1)                                        # [B, T*H, 576]
    s = _scores(qf, kv.transpose(1, 2)) * scale                         # [B, T*H, S] fp32
    s = s.masked_fill(~vis.repeat_interleave(h, dim=1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    o = torch.bmm(p.to(kv.dtype), kv[..., :dc].nan_to_num(0.0))
    return o.reshape(b, t, h, dc), lse.reshape(b, t, h)


def _prepared(fn):
    """The family contract's form (suite/families/__init__.py): inputs in, the zero-argument timed call out."""
    def prepare(q, kv, past_lens, anc, scale, dc: int = 512):
        return lambda: fn(q, kv, past_lens, anc, scale, dc)
    return prepare


prepare_eager, prepare_sdpa, prepare_twopass = _prepared(eager), _prepared(sdpa), _prepared(twopass)
