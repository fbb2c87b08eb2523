"""Batch-invariant forms of every op on the target's forward path: a row's output is bitwise independent of how
many other rows share the call and of their values. CUDA: fixed-config Triton kernels (invariant_triton.py);
CPU: elementwise products and fixed pairwise trees, invariant by construction. Design: plans/0010-batch-invariant.md.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from . import invariant_triton as tk

HALF = (torch.float16, torch.bfloat16)
CPU_CHUNK = 1 << 22   # elements of one CPU product tensor (rows are chunked; chunking never changes a row)


def _cd(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in HALF else dtype


def _cuda(x: torch.Tensor) -> bool:
    """CUDA tensors take the Triton kernels, which must be available: never a silent non-invariant fallback."""
    if x.device.type != "cuda":
        return False
    if not tk.AVAILABLE:
        raise RuntimeError(f"batch-invariant mode on CUDA needs Triton ({tk.IMPORT_ERROR}); it has no fallback")
    return True


def tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last axis by a fixed pairwise tree of elementwise adds ((x0+x1)+(x2+x3))...: every output
    element sees the same additions in the same order whatever the other axes hold. Trailing zeros do not change
    the result (a padded tree's extra subtrees add exact zeros), so padding keys to a longer list is harmless."""
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = torch.cat((x, torch.zeros_like(x[..., :1])), dim=-1)
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0]


def ordered_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over a short last axis (the top-k) left to right: x[..., 0] + x[..., 1] + ..."""
    acc = x[..., 0]
    for j in range(1, x.shape[-1]):
        acc = acc + x[..., j]
    return acc


_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10   # fdlibm's split of ln 2
_EXP_TAYLOR = [1.0 / math.factorial(i) for i in range(14, -1, -1)]  # degree 14, Horner order


def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x. CUDA: torch.exp (one device function per element). CPU: torch's vectorized and scalar-tail paths
    round transcendentals differently, so a value would depend on its position in the call; instead range
    reduction + a Taylor polynomial in float64 from exactly rounded +, -, *, and 2^k by bit construction."""
    if x.device.type == "cuda":
        return torch.exp(x)
    xd = x.double()
    k = torch.round(xd / _LN2_HI).clamp(-1020, 1020)
    r = (xd - k * _LN2_HI) - k * _LN2_LO                               # |r| <= ~0.35
    p = torch.full_like(r, _EXP_TAYLOR[0])
    for c in _EXP_TAYLOR[1:]:
        p = p * r + c
    two_k = ((k.to(torch.int64) + 1023) << 52).view(torch.float64)     # exact 2^k
    y = torch.where(xd < -708.0, 0.0, torch.where(xd > 709.0, float("inf"), p * two_k))
    return y.to(x.dtype)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) if x.device.type == "cuda" else (1.0 / (1.0 + exp(-x.double()))).to(x.dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), computed in float32 or wider and rounded to x's dtype."""
    if x.device.type == "cuda":
        return torch.nn.functional.silu(x)
    return (x.double() / (1.0 + exp(-x.double()))).to(x.dtype)


def _dot_cpu(x: torch.Tensor, w: torch.Tensor, cd: torch.dtype) -> torch.Tensor:
    """x [M, H, K], w [H, N, K] -> [M, H, N] in cd: exact elementwise products, tree_sum over K, row chunks."""
    M, H, K = x.shape
    N = w.shape[1]
    step = max(1, CPU_CHUNK // max(1, H * N * K))
    wc = w.to(cd)[None]                                         # [1, H, N, K]
    parts = [tree_sum(x[i:i + step].to(cd)[:, :, None, :] * wc) for i in range(0, M, step)]
    return torch.cat(parts, dim=0) if parts else x.new_zeros((0, H, N), dtype=cd)


def linear(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] @ w[N, K].T -> [..., N] in out_dtype (default x's; fp32 accumulation for half inputs, so
    out_dtype float32 is the accumulator itself: the lm_head's logits, plans/0017)."""
    lead, K = x.shape[:-1], x.shape[-1]
    x2, out_dtype = x.reshape(-1, K), out_dtype or x.dtype
    if _cuda(x):
        y = tk.matmul(x2[:, None, :], w[None], out_dtype)[:, 0]
    else:
        y = _dot_cpu(x2[:, None, :], w[None], _cd(x.dtype))[:, 0].to(out_dtype)
    return y.reshape(*lead, w.shape[0])


def head_matmul(x: torch.Tensor, w: torch.Tensor, w_is_kn: bool) -> torch.Tensor:
    """Per-head products of MLA's absorbed forms. x [M, H, K]; w [H, N, K] (w_is_kn False) or [H, K, N]
    (True, read transposed without a copy) -> [M, H, N] in x's dtype."""
    wn = w.transpose(1, 2) if w_is_kn else w                    # [H, N, K] view
    if _cuda(x):
        return tk.matmul(x, wn, x.dtype)
    return _dot_cpu(x, wn, _cd(x.dtype)).to(x.dtype)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * w over the last axis in compute dtype (float32 for half), returned in x's dtype."""
    if _cuda(x):
        return tk.rms_norm(x, w, eps)
    xc = x.to(_cd(x.dtype))
    ms = tree_sum(xc * xc) / x.shape[-1]
    return (xc * (1.0 / torch.sqrt(ms + eps))[..., None] * w.to(xc.dtype)).to(x.dtype)   # sqrt, / exactly rounded


def gate_logits(x: torch.Tensor, w_gate: torch.Tensor) -> torch.Tensor:
    """[N, E] router logits from float32-rounded inputs: a float32 (IEEE, no TF32) kernel on CUDA; on CPU
    float32 products summed in float64 (exact products) for a float64 model, in float32 otherwise."""
    xf, wf = x.float(), w_gate.float()
    if _cuda(x):
        return tk.matmul(xf[:, None, :], wf[None], torch.float32)[:, 0]
    if x.dtype == torch.float64:
        return _dot_cpu(xf.double()[:, None, :], wf.double()[None], torch.float64)[:, 0].float().double()
    return _dot_cpu(xf[:, None, :], wf[None], torch.float32)[:, 0]


def swiglu(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """W2 (silu(W1 x) * W3 x) with invariant GEMMs; the elementwise middle is invariant as it is."""
    return linear(silu(linear(x, w1)) * linear(x, w3), w2)


def experts(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, w1, w2, w3) -> torch.Tensor:
    """Routed experts, deterministic combine. x [N, d]; idx / weights [N, k]; w1/w3 [E, mi, d], w2 [E, d, mi].
    Each (token, slot) output is its own row's product with its expert (fixed tiling per row block); the
    combine sums weight * output over the k slots in selection order, in float32 (float64 for float64 x)."""
    N, k = idx.shape
    if _cuda(x):
        out = tk.grouped_swiglu(x, idx, w1, w2, w3)             # [N, k, d] in slot order
    else:
        out = torch.zeros(N, k, x.shape[1], dtype=x.dtype)
        for e in torch.unique(idx).tolist():                    # CPU: rows are independent, so a loop is fine
            rows, slots = torch.nonzero(idx == e, as_tuple=True)
            out[rows, slots] = swiglu(x[rows], w1[e], w2[e], w3[e])
    cd = _cd(x.dtype)
    return ordered_sum((weights.to(cd)[..., None] * out.to(cd)).transpose(1, 2)).to(x.dtype)


class KeyLists(NamedTuple):
    """Per query row r (= b * T + t): the keys it sees in LOGICAL position order. Positions 0..c-1 are cache
    slots 0..c-1 (committed prefix), positions c..c+nt-1 are slots c + tidx[r, 0..nt-1]: the row's
    ancestors-or-self in the tree (or causal block) sorted by depth. AR (T = 1) is c = past_len, nt = 1."""
    row_b: torch.Tensor   # [R] int32 request of each row
    c: torch.Tensor       # [R] int32 committed prefix length
    nt: torch.Tensor      # [R] int32 tree keys (depth + 1 for a tree node)
    tidx: torch.Tensor    # [R, T] int32 tree slot offsets, depth order first, then padding


def key_lists(past_lens: torch.Tensor, T: int, anc: torch.Tensor | None) -> KeyLists:
    """anc [B, T, W] int64 ancestor-or-self bits, or None (causal among the T new rows: prefill, AR)."""
    B, dev = past_lens.shape[0], past_lens.device
    j = torch.arange(T, device=dev)
    if anc is None:
        bits = (j[None, :] <= j[:, None]).expand(B, T, T)
    else:
        bits = ((anc[:, :, j // 64] >> (j % 64)) & 1).bool()      # [B, T(row), T(key)]
    nt = bits.sum(-1)                                               # [B, T] ancestors-or-self = depth + 1
    depth_key = torch.where(bits, nt[:, None, :], T + 1)            # ancestor j ordered by its own depth
    tidx = torch.sort(depth_key, dim=-1, stable=True).indices       # [B, T, T]
    row_b = torch.arange(B, device=dev, dtype=torch.int32)[:, None].expand(B, T)
    c = past_lens.to(torch.int32)[:, None].expand(B, T)
    # contiguous(): reshape of an expanded [1, T] is a stride-0 view, which a kernel indexing r would overrun
    return KeyLists(row_b.reshape(-1).contiguous(), c.reshape(-1).contiguous(),
                    nt.to(torch.int32).reshape(-1).contiguous(), tidx.to(torch.int32).reshape(B * T, T).contiguous())


def attention(q_lat, q_pe, kv, past_lens, anc, scale: float) -> torch.Tensor:
    """Absorbed MLA over the logical key lists: q_lat [B, T, H, dc], q_pe [B, T, H, dr], kv [B, S, dc + dr]
    (this layer's cache, new rows already written) -> o_lat [B, T, H, dc]. The same code serves prefill
    (anc None), AR decode (T = 1) and tree verify; a row's reduction over keys depends only on its own list."""
    B, T, H, dc = q_lat.shape
    kl = key_lists(past_lens, T, anc)
    q = torch.cat((q_lat, q_pe), dim=-1).reshape(B * T, H, -1)
    if _cuda(q):
        o = tk.attention(q.contiguous(), kv, kl, scale, dc)
    else:
        o = _attention_cpu(q, kv, kl, scale, dc)
    return o.view(B, T, H, dc).to(q_lat.dtype)


def _attention_cpu(q, kv, kl: KeyLists, scale: float, dc: int) -> torch.Tensor:
    """q [R, H, D] -> [R, H, dc]: scores by tree_sum over D, exact max, exp, tree_sum over the key list."""
    R, H, D = q.shape
    cd = _cd(q.dtype)
    n = (kl.c + kl.nt).to(torch.int64)                              # [R] keys per row
    L = int(n.max()) if R else 0
    pos = torch.arange(L)[None, :]                                  # [1, L] logical positions
    c = kl.c.to(torch.int64)[:, None]
    t = kl.tidx.to(torch.int64).gather(1, (pos - c).clamp(0, kl.tidx.shape[1] - 1))
    slot = torch.where(pos < c, pos, c + t)
    valid = pos < n[:, None]                                        # [R, L]
    keys = kv[kl.row_b.to(torch.int64)[:, None], torch.where(valid, slot, 0)].to(cd)  # [R, L, D]
    keys = keys.masked_fill(~valid[..., None], 0.0)
    step = max(1, CPU_CHUNK // max(1, H * L * D))
    out = []
    for i in range(0, R, step):
        k_i, v_i = keys[i:i + step], keys[i:i + step, :, :dc]
        s = tree_sum(q[i:i + step].to(cd)[:, :, None, :] * k_i[:, None]) * scale    # [r, H, L]
        s = s.masked_fill(~valid[i:i + step, None, :], float("-inf"))
        p = exp(s - s.amax(-1, keepdim=True))
        num = tree_sum((p[:, :, :, None] * v_i[:, None]).transpose(-1, -2))           # [r, H, dc]
        out.append(num / tree_sum(p)[..., None])
    return torch.cat(out, dim=0) if out else q.new_zeros((0, H, dc), dtype=cd)
