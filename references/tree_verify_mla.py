"""Reference for the tree_verify_mla kernel family: absorbed MLA attention of T tree rows over a latent
cache whose prefix is fully visible and whose tree part is masked by ancestor bits (notes/mla_moe.md §5).

Bit layout of anc_bits [..., T, W] uint64 (W = ceil(T/64)): tree row j is bit (j % 64) of word j // 64.
"""
from __future__ import annotations

import numpy as np

from .mla import attention_absorbed

DEFAULT_KV_LORA_RANK = 512  # the DeepSeek / Kimi latent width: q and kv rows are 576 = 512 + 64 wide


def tree_visibility(past_len: int, anc_visible: np.ndarray, n_kv: int) -> np.ndarray:
    """[T, n_kv] bool: row i sees [0, past_len) and past_len + j iff anc_visible[i, j]; all-False rows see nothing."""
    anc = np.asarray(anc_visible, dtype=bool)
    t = anc.shape[0]
    if anc.shape != (t, t):
        raise ValueError(f"anc_visible must be [T, T], got {anc.shape}")
    if n_kv < past_len + t:
        raise ValueError(f"kv has {n_kv} rows < past_len {past_len} + T {t}")
    visible = np.zeros((t, n_kv), dtype=bool)
    padding = ~anc.any(axis=1)  # [T] rows that are pure padding
    visible[:, :past_len] = ~padding[:, None]
    visible[:, past_len:past_len + t] = anc
    return visible


def tree_verify_mla(q, kv, past_len: int, anc_visible, scale: float, *,
                    kv_lora_rank: int = DEFAULT_KV_LORA_RANK) -> tuple[np.ndarray, np.ndarray]:
    """One sequence. q [T, H, dc+dr] = [q_lat | q_pe]; kv [S, dc+dr] = [c_kv | k_pe], tree rows at
    past_len..past_len+T-1; rows >= past_len + T are never read (may hold NaN). anc_visible [T, T] bool.

    Returns (o_lat [T, H, dc], lse [T, H]); lse is the natural log of sum exp(scale * q.k) over visible keys,
    and a padding row (anc_visible row all False) gives o_lat 0, lse -inf.
    """
    q = np.asarray(q, dtype=np.float64)
    kv = np.asarray(kv, dtype=np.float64)
    t, dc = q.shape[0], kv_lora_rank
    if q.shape[-1] != kv.shape[-1] or kv.shape[-1] <= dc:
        raise ValueError(f"q {q.shape} and kv {kv.shape} must share a last dim > kv_lora_rank {dc}")
    kv = kv[:past_len + t]  # [past_len + T, dc+dr]: rows beyond are outside the contract
    visible = tree_visibility(past_len, anc_visible, len(kv))
    return attention_absorbed(q[..., :dc], q[..., dc:], kv[:, :dc], kv[:, dc:], visible, scale)


def pack_anc_bits(anc_visible: np.ndarray) -> np.ndarray:
    """[..., T, T] bool -> [..., T, ceil(T/64)] uint64, bit j % 64 of word j // 64 = column j."""
    anc = np.asarray(anc_visible, dtype=bool)
    t = anc.shape[-1]
    n_words = (t + 63) // 64
    padded = np.zeros(anc.shape[:-1] + (n_words * 64,), dtype=np.uint64)
    padded[..., :t] = anc
    bits = padded.reshape(anc.shape[:-1] + (n_words, 64))
    return (bits << np.arange(64, dtype=np.uint64)).sum(axis=-1, dtype=np.uint64)


def unpack_anc_bits(anc_bits: np.ndarray, t: int) -> np.ndarray:
    """[..., T, W] uint64 (int64 bit patterns accepted, as torch stores them) -> [..., T, t] bool.

    Bits for columns >= t are ignored.
    """
    bits = np.asarray(anc_bits)
    if bits.dtype == np.int64:
        bits = bits.view(np.uint64)
    if bits.dtype != np.uint64:
        raise ValueError(f"anc_bits must be uint64 (or int64 bit patterns), got {bits.dtype}")
    if bits.shape[-1] * 64 < t:
        raise ValueError(f"anc_bits has {bits.shape[-1]} words, too few for T = {t}")
    unpacked = (bits[..., None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)  # [..., T, W, 64]
    return unpacked.reshape(bits.shape[:-1] + (-1,))[..., :t].astype(bool)


def tree_verify_mla_batch(q, kv, past_lens, anc_bits, scale: float, *,
                          kv_lora_rank: int = DEFAULT_KV_LORA_RANK) -> tuple[np.ndarray, np.ndarray]:
    """Batched, kernel-shaped: q [B,T,H,576], kv [B,S,576], past_lens [B], anc_bits [B,T,W] uint64.

    Returns (o_lat [B, T, H, dc], lse [B, T, H]); each sequence as tree_verify_mla.
    """
    q = np.asarray(q, dtype=np.float64)
    n_batch, t, n_heads = q.shape[:3]
    anc = unpack_anc_bits(anc_bits, t)  # [B, T, T]
    o_lat = np.zeros((n_batch, t, n_heads, kv_lora_rank))
    lse = np.zeros((n_batch, t, n_heads))
    for b in range(n_batch):
        o_lat[b], lse[b] = tree_verify_mla(q[b], kv[b], int(past_lens[b]), anc[b], scale,
                                           kv_lora_rank=kv_lora_rank)
    return o_lat, lse
