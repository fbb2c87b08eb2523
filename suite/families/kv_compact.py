"""kv_compact family: after acceptance, move the accepted tree rows of every layer's latent cache to the
committed positions past_len, past_len+1, ... in place (cache [layers, B, S, D])."""
from __future__ import annotations

import numpy as np

from kdbench.backends import registry
from kdbench.families import common
from kdbench.references import kv_compact as ref



def make_inputs(case, seed: int) -> dict:
    s, rng = case.shape, np.random.default_rng(seed)
    n = s.budget + 1
    past = rng.integers(1, s.past_len + 1, size=s.batch).astype(np.int32)
    n_kv = int(past.max()) + n
    cache = common.round_to(rng.normal(0, 1, (s.layers, s.batch, n_kv, s.dim)), common.run_dtype(case.dtype))
    width = min(s.depth + 1, n)
    accepted = np.full((s.batch, width), -1, dtype=np.int32)
    lens = np.zeros(s.batch, dtype=np.int32)
    for b in range(s.batch):             # a strictly increasing row list starting at the root
        k = int(rng.integers(1, width + 1))
        rows = np.sort(rng.choice(np.arange(1, n), size=k - 1, replace=False)) if k > 1 else []
        if b % 4 == 1:                   # every 4th request is already in place: the kernel may skip it
            rows = np.arange(1, k)
        accepted[b, :k] = np.concatenate([[0], rows]).astype(np.int32)
        lens[b] = k
    return {"cache": cache, "past_lens": past, "accepted": accepted, "accept_len": lens}


def reference(inputs: dict, case) -> dict:
    cache = inputs["cache"].copy()
    for b in range(case.shape.batch):
        k = int(inputs["accept_len"][b])
        cache[:, b], _ = ref.compact_kv(cache[:, b], int(inputs["past_lens"][b]), inputs["accepted"][b, :k])
    return {"cache": cache}


def run(backend: str, inputs: dict, case, device: str) -> dict:
    fn, cache = _prepare(backend, inputs, case, device)
    fn()
    return {"cache": common.to_numpy(cache).astype(np.float64)}


def outputs(backend: str, result, inputs: dict, case) -> None:
    """None: a timed call's cache cannot be checked, since compacting the same cache again moves rows that the
    first call already moved (the kernel kind checks a fresh run after timing instead)."""
    return None


def timed(backend: str, inputs: dict, case, device: str):
    """Repeated in-place compaction of the same rows is idempotent in cost: the same bytes move each time."""
    return _prepare(backend, inputs, case, device)[0]


def _prepare(backend: str, inputs: dict, case, device: str):
    compact = registry.get(backend).op("kv_compact")
    dtype = common.run_dtype(case.dtype)
    cache = common.to_torch(inputs["cache"], device, dtype)
    past = common.to_torch(inputs["past_lens"], device)
    acc = common.to_torch(inputs["accepted"], device)
    lens = common.to_torch(inputs["accept_len"], device)
    return (lambda: compact(cache, past, acc, lens)), cache


unsupported = common.every_backend      # every backend runs every case of this family
reference_for = common.case_reference   # and does the whole work


def check(got: dict, want: dict, tol):
    return common.check_outputs(got, want, tol, exact_keys=("cache",))


def bytes_moved(case, inputs: dict) -> float:
    """Each accepted row that is not already in place is read and written once per layer (bytes read +
    written, like the copy ceiling): 2 * layers * moved_rows * dim * element_bytes."""
    acc, lens = inputs["accepted"], inputs["accept_len"]
    moved = sum(int((acc[b, :lens[b]] != np.arange(lens[b])).sum()) for b in range(len(lens)))
    s = case.shape
    return float(2 * s.layers * moved * s.dim * common.ELEMENT_BYTES[common.run_dtype(case.dtype)])


def flops(case, inputs: dict) -> float:
    return 0.0
