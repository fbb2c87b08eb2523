"""KV-cache compaction after tree acceptance: keep only the accepted path's rows, contiguous after the
committed context. numpy; see ../shared/notes/ddtree.md §5.1."""
from __future__ import annotations

import numpy as np


def _check_accepted(accepted, past_len: int, seq_len: int) -> np.ndarray:
    acc = np.asarray(accepted)
    if acc.ndim != 1 or len(acc) == 0 or not np.issubdtype(acc.dtype, np.integer):
        raise ValueError(f"accepted must be a non-empty 1-D int array, got {acc.dtype} {acc.shape}")
    if acc[0] != 0:
        raise ValueError(f"accepted[0] must be 0 (the root), got {int(acc[0])}")
    if (np.diff(acc) <= 0).any():
        raise ValueError(f"accepted must be strictly increasing, got {acc.tolist()}")
    if past_len < 0 or past_len + int(acc[-1]) >= seq_len:
        raise ValueError(f"rows past_len + accepted = {past_len} + {int(acc[-1])} exceed the cache's "
                         f"{seq_len} rows (or past_len < 0)")
    return acc.astype(np.int64)


def compact_kv(cache: np.ndarray, past_len: int, accepted) -> tuple[np.ndarray, int]:
    """cache [..., S, D] (seq axis -2; any leading axes, e.g. [layers, 2, heads, S, D]).

    Row past_len + accepted[k] moves to row past_len + k. Returns (new cache, a new array with rows
    >= the new length left as they were; new length = past_len + len(accepted)). Reads all sources
    before writing; because accepted[k] >= k, an in-place copy in ascending k is equally correct."""
    c = np.asarray(cache)
    if c.ndim < 2:
        raise ValueError(f"cache must be [..., S, D], got shape {c.shape}")
    acc = _check_accepted(accepted, past_len, c.shape[-2])
    out = c.copy()
    k = len(acc)
    out[..., past_len:past_len + k, :] = c[..., past_len + acc, :]  # [..., k, D] gather then write
    return out, past_len + k
