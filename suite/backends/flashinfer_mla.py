"""Peer backends for tree_verify_mla from FlashInfer's MLA kernel (BatchMLAPagedAttentionWrapper, pinned by the
optional extra kdbench[peers]): the cascade a serving stack assembles (prefix non-causal + the masked tree block
in torch + merge_state), the prefix alone (less work: a lower bound), and one causal pass (chain trees only).

Inputs are the family's: q [B, T, H, 576] bf16, kv [B, S, 576] bf16, past_lens [B] int32, anc [B, T, W] int64.
prepare_*() copies them once into FlashInfer's paged layout and plans (outside the timed call, as a serving
stack plans once per step for all layers) and returns the timed call -> (o_lat [B, T, H, 512] bf16, lse
[B, T, H] float32 natural log). Two traps (h200_facts.md): FlashInfer's lse is base 2, which merge_state
expects; merge_state fails to launch for [rows, 64, 512], so it gets one head per row, [rows * H, 1, 512].
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

import torch

from kdbench.backends.masks import anc_to_bool
from kdbench.backends.mla_baselines import masked_attention

VERSION = "0.5.3"          # the version the optional extra pins and these calls were written against
PAGE = 64                  # rows per KV page (the page size measured in h200_facts.md)
WORKSPACE_BYTES = 128 << 20
LN2 = math.log(2.0)


def unavailable_reason() -> str | None:
    try:
        fi = importlib.import_module("flashinfer")
    except Exception as exc:   # noqa: BLE001 - ImportError, or a broken install raising anything at import
        return (f"FlashInfer is not installed ({type(exc).__name__}: {str(exc)[:120]}); "
                f"pip install 'kdbench[peers]' (flashinfer-python=={VERSION})")
    version = getattr(fi, "__version__", "?")
    if version != VERSION:
        return f"FlashInfer {version} is installed; these peers are pinned to {VERSION} (pip install 'kdbench[peers]')"
    return None


@dataclass(frozen=True)
class Paged:
    """One request batch in FlashInfer's layout: ckv [pages, PAGE, 512], kpe [pages, PAGE, 64] (NaN rows zeroed),
    q_nope [B*T, H, 512], q_pe [B*T, H, 64], the page table (request b owns pages b*P .. b*P+P-1)."""
    ckv: torch.Tensor
    kpe: torch.Tensor
    q_nope: torch.Tensor
    q_pe: torch.Tensor
    qo_indptr: torch.Tensor      # [B+1] int32: T rows per request
    kv_indptr: torch.Tensor      # [B+1] int32: page offsets
    kv_indices: torch.Tensor     # [B*P] int32


def page(q, kv, dc: int = 512) -> Paged:
    b, t, h, _ = q.shape
    pages = -(-kv.shape[1] // PAGE)
    padded = torch.zeros(b, pages * PAGE, kv.shape[-1], dtype=kv.dtype, device=kv.device)
    padded[:, :kv.shape[1]] = kv.nan_to_num(0.0)          # rows past past_len + T hold NaN in the family's inputs
    flat = padded.view(b * pages, PAGE, -1)
    dev = q.device
    return Paged(flat[..., :dc].contiguous(), flat[..., dc:].contiguous(),
                 q[..., :dc].reshape(b * t, h, dc).contiguous(), q[..., dc:].reshape(b * t, h, -1).contiguous(),
                 torch.arange(0, (b + 1) * t, t, dtype=torch.int32, device=dev),
                 torch.arange(0, (b + 1) * pages, pages, dtype=torch.int32, device=dev),
                 torch.arange(b * pages, dtype=torch.int32, device=dev))


def _wrapper(p: Paged, kv_len: torch.Tensor, heads: int, causal: bool, scale: float):
    fi = importlib.import_module("flashinfer")
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=p.ckv.device)
    w = fi.mla.BatchMLAPagedAttentionWrapper(workspace, backend="auto")
    w.plan(p.qo_indptr, p.kv_indptr, p.kv_indices, kv_len.to(torch.int32), heads, p.ckv.shape[-1],
           p.kpe.shape[-1], PAGE, causal, scale, p.q_nope.dtype, p.ckv.dtype)
    return w


def _run(w, p: Paged) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B*T, H, 512] bf16, lse [B*T, H] float32, base 2)."""
    return w.run(p.q_nope, p.q_pe, p.ckv, p.kpe, return_lse=True)


def prepare_prefix(q, kv, past_lens, anc, scale: float, dc: int = 512):
    """Every row over its request's committed prefix only (no tree block, no padding rows): less work than the
    case asks, so it is checked against the float64 prefix-only reference."""
    b, t, h, _ = q.shape
    p = page(q, kv, dc)
    w = _wrapper(p, past_lens, h, False, scale)

    def call():
        o, lse2 = _run(w, p)
        return o.view(b, t, h, dc), (lse2 * LN2).view(b, t, h)
    return call


def prepare_causal(q, kv, past_lens, anc, scale: float, dc: int = 512):
    """One causal pass over prefix + T rows: row i sees keys [0, past_len + i], the ancestor mask of a chain."""
    b, t, h, _ = q.shape
    p = page(q, kv, dc)
    w = _wrapper(p, past_lens + t, h, True, scale)

    def call():
        o, lse2 = _run(w, p)
        return o.view(b, t, h, dc), (lse2 * LN2).view(b, t, h)
    return call


def prepare_cascade(q, kv, past_lens, anc, scale: float, dc: int = 512):
    """FlashInfer over the prefix + the tree block (T x T, masked) in torch + flashinfer.merge_state; rows with
    an all-zero mask (padding) give o 0, lse -inf as the contract says."""
    fi = importlib.import_module("flashinfer")
    b, t, h, _ = q.shape
    p = page(q, kv, dc)
    w = _wrapper(p, past_lens, h, False, scale)
    idx = past_lens[:, None].long() + torch.arange(t, device=kv.device)[None, :]              # [B, T]
    vis = anc_to_bool(anc, t)                                                                 # [B, T, T]
    real = vis.any(-1)[..., None]                                                             # [B, T, 1]

    def call():
        o1, l1 = _run(w, p)                                                                    # base-2 lse
        tree_kv = torch.gather(kv, 1, idx[..., None].expand(b, t, kv.shape[-1]))              # [B, T, 576]
        o2, l2 = masked_attention(q, tree_kv, vis, scale, dc)                                  # natural lse
        o, l = fi.merge_state(o1.reshape(b * t * h, 1, dc), l1.reshape(b * t * h, 1),
                              o2.reshape(b * t * h, 1, dc), (l2 / LN2).reshape(b * t * h, 1))
        o = torch.where(real[..., None], o.view(b, t, h, dc), 0.0)
        lse = torch.where(real, l.view(b, t, h) * LN2, float("-inf"))
        return o, lse
    return call
