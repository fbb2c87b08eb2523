"""tree_verify_mla family: absorbed MLA attention of T tree nodes x H heads per request over the latent
cache (prefix + tree block) under the ancestor mask.

Backends (suite/backends/registry.py): numpy_ref, torch (eager matmul + masked softmax), torch_sdpa (boolean
mask), torch_twopass (prefix + tree block + LSE merge), cuda (the fused kernel: wgmma on sm_90), cuda_mma (its
mma.sync path) and the FlashInfer peers (flashinfer_cascade, flashinfer_prefix: less work, flashinfer_causal:
chain trees).
The float64 reference checks every request and head of small cases (all validation cases) and the first and
last request x heads {0, 1, H-2, H-1} of big benchmark shapes (_checked), on host threads.
"""
from __future__ import annotations

import numpy as np

from kdbench.backends import registry
from kdbench.families import common
from kdbench.references import tree_verify_mla as ref
from kdbench.references.mla import attention_absorbed
from kdbench.references.model_config import get_preset

BF16_ONLY = ("ours", "peer")   # roles whose kernels read bf16 caches of the 512 + 64 latent only
SCALE = get_preset("kimi-k2").softmax_scale
REFERENCE_WORK = 250_000_000   # (row, key) pairs above which the reference checks a subset (_checked)
CHECK_ROWS = 150_000           # output rows x comparisons above which it checks a subset (_checked)
HEAD_CHUNK = 32    # heads per reference call: wide enough that its [H, 512] x [512, S] matmuls stay efficient


def make_inputs(case, seed: int) -> dict:
    s, rng = case.shape, np.random.default_rng(seed)
    d = s.kv_lora + s.rope
    past = (rng.integers(1, s.past_len + 1, size=s.batch) if s.ragged else np.full(s.batch, s.past_len))
    n_kv = int(past.max()) + s.nodes
    kv = common.standard_normal(rng, (s.batch, n_kv, d), common.run_dtype(case.dtype))      # [B, S, 576]
    for b in range(s.batch):                     # unused cache slots hold NaN: they must never leak
        kv[b, past[b] + s.nodes:] = np.nan
    q = common.standard_normal(rng, (s.batch, s.nodes, s.heads, d), common.run_dtype(case.dtype))  # [B, T, H, 576]
    vis = np.stack([_tree_visibility(s.nodes, s.tree, rng) for _ in range(s.batch)])
    if s.padding:                                 # trailing padding rows: anc all zero, they see nothing
        vis[:, s.nodes - s.padding:, :] = False
    return {"q": q, "kv": kv, "past_lens": past.astype(np.int32), "anc": ref.pack_anc_bits(vis)}


def _tree_visibility(t: int, kind: str, rng) -> np.ndarray:
    """[T, T] ancestor-or-self visibility of a chain or of a random tree (parent[i] drawn from 0..i-1)."""
    parents = np.arange(-1, t - 1) if kind == "chain" else np.array(
        [-1] + [int(rng.integers(0, i)) for i in range(1, t)])
    vis = np.eye(t, dtype=bool)
    for i in range(1, t):
        vis[i, :i] = vis[parents[i], :i]
    return vis


def unsupported(backend: str, case) -> str | None:
    """Our kernel and the peers read bf16 only (a float32 case would hold them to float32 tolerances they
    cannot meet) at the DeepSeek latent width; flashinfer_causal's mask is a chain's."""
    s = case.shape
    if registry.role(backend) in BF16_ONLY and case.dtype != "bfloat16":
        return f"{backend} takes bfloat16 inputs; run this case with dtype: bfloat16"
    if registry.role(backend) in BF16_ONLY and (s.kv_lora, s.rope) != (512, 64):
        return f"{backend} is built for kv_lora 512 + rope 64"
    if backend == "flashinfer_causal" and (s.tree != "chain" or s.padding):
        return "flashinfer_causal computes a causal mask: chain trees without padding rows only"
    return None


def _checked(case) -> tuple[list[int], list[int]]:
    """(requests, heads) the float64 reference checks: all of them while the case is small, else the first
    and last request and heads {0, 1, H-2, H-1} (heads are computed alike, so the edges find index bugs).
    Small: at most REFERENCE_WORK (row, key) pairs (the reference's cost) and at most CHECK_ROWS output rows
    times comparisons, backends x (trials + the re-check after timing) (check.compare's cost, ~0.1 ms
    per row of 513 values on one core). Every validation case is small (the largest: B 3 x T 129 x H 128 = 49,536 rows,
    4226 keys, 2.1e8 pairs, 1 backend x 3 comparisons); a benchmark case with 5 backends keeps the full
    check up to 15K rows. All T rows and all keys of the checked heads are compared in either case."""
    s = case.shape
    rows = s.batch * s.nodes * s.heads
    work = rows * (s.past_len + s.nodes)
    if work <= REFERENCE_WORK and rows * len(case.backends) * (case.trials + 1) <= CHECK_ROWS:
        return list(range(s.batch)), list(range(s.heads))
    return sorted({0, s.batch - 1}), sorted({0, min(1, s.heads - 1), max(s.heads - 2, 0), s.heads - 1})


def reference(inputs: dict, case) -> dict:
    """ref.tree_verify_mla per (checked request, chunk of HEAD_CHUNK checked heads), the chunks on threads
    (numpy releases the GIL): the loop of ref.tree_verify_mla_batch, split so a 16-core host runs it in
    parallel. Heads are independent rows of the reference, so the split changes no value beyond float64
    rounding. Returns o_lat [R, T, h, dc] float64 and lse [R, T, h] for the R checked requests, h heads."""
    anc = ref.unpack_anc_bits(inputs["anc"], case.shape.nodes)           # [B, T, T] bool

    def one(b, hs):
        return ref.tree_verify_mla(inputs["q"][b][:, hs], inputs["kv"][b], int(inputs["past_lens"][b]), anc[b],
                                   SCALE, kv_lora_rank=case.shape.kv_lora)
    return _per_chunk(one, case)


def reference_for(backend: str, inputs: dict, case) -> dict | None:
    """flashinfer_prefix attends to the committed prefix only: its truth is every row over [0, past_len)."""
    if registry.get(backend).same_work:
        return None
    dc = case.shape.kv_lora

    def one(b, hs):
        q = inputs["q"][b][:, hs].astype(np.float64)                       # [T, h, 576]
        kv = inputs["kv"][b][:int(inputs["past_lens"][b])].astype(np.float64)
        visible = np.ones((q.shape[0], len(kv)), dtype=bool)
        return attention_absorbed(q[..., :dc], q[..., dc:], kv[:, :dc], kv[:, dc:], visible, SCALE)
    return _per_chunk(one, case)


def _per_chunk(one, case) -> dict:
    """one(request, heads) -> (o [T, h, dc], lse [T, h]) over the checked requests and HEAD_CHUNK head chunks."""
    reqs, heads = _checked(case)
    chunks = [heads[i:i + HEAD_CHUNK] for i in range(0, len(heads), HEAD_CHUNK)]
    parts = common.parallel_map(lambda unit: one(*unit), [(b, hs) for b in reqs for hs in chunks], blas=True)
    per_req = [parts[i:i + len(chunks)] for i in range(0, len(parts), len(chunks))]
    o = np.stack([np.concatenate([p[0] for p in r], axis=1) for r in per_req])
    lse = np.stack([np.concatenate([p[1] for p in r], axis=1) for r in per_req])
    return {"o_lat": o, "lse": lse}


def run(backend: str, inputs: dict, case, device: str) -> dict:
    s = case.shape
    common.poison_allocator(device, s.batch * s.nodes * s.heads * (s.kv_lora * 2 + 4))
    return outputs(backend, timed(backend, inputs, case, device)(), inputs, case)


def outputs(backend: str, result, inputs: dict, case) -> dict:
    """A timed call's (o_lat, lse | None) -> the checked requests and heads, as numpy."""
    o, lse = result
    reqs, heads = _checked(case)
    out = {"o_lat": common.to_numpy(o[reqs][:, :, heads])}   # slice on the device, copy the subset
    if lse is not None:                          # torch SDPA does not return the LSE
        out["lse"] = common.to_numpy(lse[reqs][:, :, heads])
    return out


def timed(backend: str, inputs: dict, case, device: str):
    """The registry's op prepares once (a peer's paged copy and plan()) and returns the timed call."""
    dtype = "bfloat16" if registry.role(backend) in BF16_ONLY else common.run_dtype(case.dtype)
    q, kv, past, anc = _on_device(inputs, device, dtype)
    return registry.get(backend).op("tree_verify_mla")(q, kv, past, anc, SCALE, case.shape.kv_lora)


def _on_device(inputs: dict, device: str, dtype: str) -> tuple:
    """(q, kv, past_lens, anc) on the device, copied once per inputs and dtype (kept in inputs["_device"]) and
    shared by every backend and call: all of them only read their inputs, and at B 32, ctx 32K the cache is
    2.4 GB of float32 to convert and copy, 3 calls x 5 backends per case. A backend that wrote its inputs
    would now fail its own re-check after timing and the backends after it, instead of going unseen."""
    cache = inputs.setdefault("_device", {})
    if (device, dtype) not in cache:
        cache[(device, dtype)] = (common.to_torch(inputs["q"], device, dtype),           # [B, T, H, 576]
                                  common.to_torch(inputs["kv"], device, dtype),          # [B, S, 576]
                                  common.to_torch(inputs["past_lens"], device),          # [B] int32
                                  common.to_torch(inputs["anc"].view(np.int64), device))  # [B, T, W] int64
    return cache[(device, dtype)]


def check(got: dict, want: dict, tol):
    return common.check_outputs(got, {k: v for k, v in want.items() if k in got or k == "o_lat"}, tol)


def bytes_moved(case, inputs: dict) -> float:
    """Per request: its KV rows read once (prefix + tree), q read, o_lat written, lse written; the actual
    (possibly ragged) past lengths of the timed inputs."""
    s, e = case.shape, common.ELEMENT_BYTES[common.run_dtype(case.dtype)]
    d = s.kv_lora + s.rope
    rows = s.nodes * s.heads
    kv_rows = float(np.sum(inputs["past_lens"].astype(np.float64) + s.nodes))
    return kv_rows * d * e + s.batch * rows * (d * e + s.kv_lora * e + 4)


def flops(case, inputs: dict) -> float:
    """2*(dc+dr) for q.k plus 2*dc for p.v per (row, key), over every key of the request's prefix + tree
    (the kernel computes the masked tree tile too): 2176 per pair at 512/64."""
    s = case.shape
    per_pair = 2 * (s.kv_lora + s.rope) + 2 * s.kv_lora
    kv_rows = float(np.sum(inputs["past_lens"].astype(np.float64) + s.nodes))
    return per_pair * s.heads * s.nodes * kv_rows
