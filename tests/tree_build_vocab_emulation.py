"""numpy emulation of the tree_build vocabulary pass (csrc/tree_build_vocab.h) at the device's granularity: the
chunk / thread / warp layout of admission and compaction, warps taking their slots in any order, `sm.count = kept`
after a prune, split + merge and the planner. Used by tests/test_tree_build_emulation.py (CPU, no CUDA)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

THREADS, PER, WARPS = 256, 16, 8        # vocab::kThreads, kPer, kWarps
CHUNK = THREADS * PER                   # 4096 logits per block step
CAP = 6144                              # vocab::kCap keys of shared memory
COMPACT_AT = CAP - CHUNK                # capacity: prune when more than this are held
MARK_MIN = 512                          # kMarkShipped: prune already at max(2k, 512) held (prune_mark)
SMALL_K_MAX = 64                        # kSmallKMax: to this k the block ends by rank (kBitsRank, s20)
SAMPLE_MIN_CHUNKS, SAMPLE_SEG_VECS = 8, 8  # kSampleMinChunks, kSampleSegVecs (128-byte segments of the sample)
H200_SMS = 132
MAX_AUTO_SPLITS = 8                     # tree_build_topk_plan's kMaxAutoSplits
U64 = np.uint64


@dataclass(frozen=True)
class Device:
    """What the emulation models: warp_order 'asc' | 'desc' | 'random' (the order in which a step's warps win
    their shared atomics); guarded=False is the round-2 code the H200 failed (tie stop after an id-bit pass);
    bounds=False admits and prunes as that code did (the whole first chunk, merges from key 1, prunes only at
    COMPACT_AT), before first_bound, merge_bound and the prune mark (2026-12-01 s4). The shipped kernel (kLane)
    gives slots in any lane and warp order; the emulation permutes warps (lanes in order), and the result must
    not depend on either: keys are distinct and every selection is by key value."""
    warp_order: str = "random"
    guarded: bool = True
    bounds: bool = True
    seed: int = 0


def make_keys(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """make_key: float_order_key(x) << 32 | ~id; x float32 [n], ids [n] -> uint64 [n]; -0 and +0 one key."""
    u = np.where(x == 0, np.float32(0), x).astype(np.float32).view(np.uint32)
    okey = np.where(u & np.uint32(0x80000000), ~u, u | np.uint32(0x80000000))
    return (okey.astype(U64) << U64(32)) | (~ids.astype(np.uint32)).astype(U64)


def value_of(key_hi: int) -> np.float32:
    """float_from_order_key of a key's high word (NaN -> -inf as prune() does)."""
    k = np.uint32(key_hi)
    u = k & np.uint32(0x7FFFFFFF) if k & np.uint32(0x80000000) else ~k
    f = np.array([u], np.uint32).view(np.float32)[0]
    return np.float32(-np.inf) if np.isnan(f) else f


def radix_select_ge(keys: np.ndarray, k: int, tie_slack: int, dev: Device) -> tuple[int, int]:
    """radix_select_ge: (t, kept), the device's digit windows and exits. The device trusts `kept` as the count of
    keys >= t; callers check that."""
    o, a = int(np.bitwise_or.reduce(keys)), int(np.bitwise_and.reduce(keys))
    vary, common, m64 = o ^ a, a, (1 << 64) - 1
    prefix = mask = 0
    krem = k
    while vary & ~mask & m64:
        hi = (vary & ~mask & m64).bit_length() - 1
        shift = max(hi - 7, 32 if hi >= 32 else 0)      # digits never straddle the value / id words
        dmask = (2 << (hi - shift)) - 1
        match = keys[(keys & U64(mask)) == U64(prefix)]
        hist = np.bincount(((match >> U64(shift)) & U64(dmask)).astype(np.int64), minlength=256)[::-1]
        incl = np.cumsum(hist)                          # keys from the top bin down (find_digit)
        i = int(np.argmax(incl >= krem))
        prefix |= (255 - i) << shift
        mask |= dmask << shift
        krem -= int(incl[i] - hist[i])
        binc = int(hist[i])
        t = prefix | (common & ~vary & ~mask & m64)
        if binc == krem:
            return t, k
        value_decided = ((vary & ~mask & m64) >> 32) == 0
        if tie_slack > 0 and (shift >= 32 or not dev.guarded) and value_decided and binc - krem <= tie_slack:
            return t & 0xFFFFFFFF00000000, k - krem + binc
    raise AssertionError("unreachable: distinct keys end with bin == krem")


def _warp_rank(rounds: int, rng: np.random.Generator, dev: Device) -> np.ndarray:
    """[rounds, WARPS] arrival rank of each warp in each block step."""
    if dev.warp_order == "asc":
        return np.tile(np.arange(WARPS), (rounds, 1))
    if dev.warp_order == "desc":
        return np.tile(np.arange(WARPS)[::-1], (rounds, 1))
    return np.argsort(rng.random((rounds, WARPS)), axis=1).argsort(axis=1)


def prune(keys: np.ndarray, k: int, tie_slack: int, rng: np.random.Generator, dev: Device):
    """prune(): survivors compacted in rounds of 4 * THREADS slots (warp slots in arrival order, then lane, then
    q), then `sm.count = kept` truncates. Returns (held, t, kept, survivors)."""
    t, kept = radix_select_ge(keys, k, tie_slack, dev)
    p = np.arange(keys.size)
    rnd, q, tid = p // (4 * THREADS), (p % (4 * THREADS)) // THREADS, p % THREADS
    rank = _warp_rank(int(rnd.max()) + 1, rng, dev)[rnd, tid // 32]
    order = np.lexsort((q, tid % 32, rank, rnd))        # slot order: round, warp arrival, lane, q
    surv = keys[order][keys[order] >= U64(t)]
    assert kept <= surv.size, "kept > survivors: the device would count stale slots"
    return surv[:kept], t, kept, surv.size


def _chunk(x: np.ndarray, c: int, vw: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chunk c as the threads hold it: (idx, valid, vals), each [THREADS, PER]; thread tid's element j is
    chunk_index<VW>(c, j), logits at or beyond V read as -inf."""
    j, tid = np.arange(PER)[None, :], np.arange(THREADS)[:, None]
    idx = c * CHUNK + (j // vw) * (THREADS * vw) + tid * vw + j % vw
    valid = idx < x.size
    return idx, valid, np.where(valid, x[np.minimum(idx, x.size - 1)], np.float32(-np.inf))


def first_bound(x: np.ndarray, c: int, vw: int, k: int) -> np.float32:
    """first_bound(): the smallest over warps of the ceil(k / WARPS)-th largest lane max of chunk c (NaN maxima
    count as -inf; unlike the kernel's fmaxf, one NaN makes a lane's max NaN here: NaN logits are outside the
    contract); -inf when k > THREADS (the first chunk is admitted whole)."""
    if k > THREADS:
        return np.float32(-np.inf)
    mc = _chunk(x, c, vw)[2].max(axis=1)
    mc = np.where(np.isnan(mc), np.float32(-np.inf), mc).reshape(WARPS, 32)
    kw = -(-k // WARPS)
    return np.float32(np.sort(mc, axis=1)[:, 32 - kw].min())


def _admit(x: np.ndarray, c: int, vw: int, thr: np.float32, rng: np.random.Generator, dev: Device) -> np.ndarray:
    """admit() over chunk c: a warp appends its lanes' passing keys (lane order, j order) at the slot its atomic
    won."""
    idx, valid, vals = _chunk(x, c, vw)
    ok = valid & (vals >= thr)
    parts = [make_keys(vals[w * 32:(w + 1) * 32][ok[w * 32:(w + 1) * 32]],
                       idx[w * 32:(w + 1) * 32][ok[w * 32:(w + 1) * 32]]) for w in range(WARPS)]
    rank = _warp_rank(1, rng, dev)[0]
    return np.concatenate([parts[w] for w in np.argsort(rank)])


def _finish_sorted(held: np.ndarray, k: int, rng: np.random.Generator, dev: Device) -> np.ndarray:
    """finish_sorted(): an exact prune to k, sorted descending, 0-padded to k."""
    if held.size > k:
        held = prune(held, k, 0, rng, dev)[0]
    out = np.zeros(k, U64)
    out[:held.size] = np.sort(held)[::-1]
    return out


def finish_by_rank(held: np.ndarray, k: int, rng: np.random.Generator, dev: Device) -> np.ndarray:
    """finish_by_rank(): with at most THREADS keys held, key i goes to slot (how many held keys are larger) when
    that is below k, 0-padded to k; more keys held: finish_sorted()."""
    if held.size > THREADS:
        return _finish_sorted(held, k, rng, dev)
    rank = (held[None, :] > held[:, None]).sum(axis=1)
    out = np.zeros(k, U64)
    out[rank[rank < k]] = held[rank < k]
    return out


def sample_ids(c0: int, cv: int, vw: int) -> np.ndarray:
    """sample_estimate()'s THREADS * PER logit ids: vectors of vw logits in segments of SAMPLE_SEG_VECS spread evenly
    over the vector chunks [c0, cv), sample vector v at segment v // SAMPLE_SEG_VECS, offset v % SAMPLE_SEG_VECS."""
    nvecs = THREADS * (PER // vw)
    stride = (cv - c0) * (CHUNK // vw) // (nvecs // SAMPLE_SEG_VECS)
    v = np.arange(nvecs)
    g = c0 * (CHUNK // vw) + (v // SAMPLE_SEG_VECS) * stride + v % SAMPLE_SEG_VECS
    return (g[:, None] * vw + np.arange(vw)[None, :]).ravel()


def sample_m(k: int, chunks: int) -> int:
    """sample_m(): the z rule (z = 4), the smallest m with m f - k >= z sqrt(m) f (f = the block's vector chunks),
    clamped to [8, CHUNK]; float64 as the device (which may contract into FMAs: m can differ by one there, and m
    decides only how many keys are held and how often a block streams again, not the outputs)."""
    z, f = 4.0, float(chunks)
    s = (z * f + np.sqrt(z * z * f * f + 4.0 * f * k)) / (2.0 * f)
    return int(min(CHUNK, max(8, np.ceil(s * s))))


def bisect_estimate(x: np.ndarray, c0: int, cv: int, k: int, vw: int) -> np.float32:
    """sample_estimate(): the largest 16-bit p with at least sample_m(k, cv - c0) of the sample's (sample_ids) order
    keys >> 16 >= p, as the float whose order key is p << 16; NaN -> -inf."""
    ids = sample_ids(c0, cv, vw)
    hi = (make_keys(x[ids], ids) >> U64(48)).astype(np.int64)   # float_order_key >> 16 (make_key's -0 is +0: same)
    m = sample_m(k, cv - c0)
    p = int(np.sort(hi)[::-1][m - 1])                              # the largest p with count(hi >= p) >= m
    return value_of(p << 16)


def fixed_stream(x: np.ndarray, c0: int, c1: int, k: int, est: np.float32) -> np.ndarray | None:
    """FixedStream over chunks [c0, c1): the keys of every logit >= est (their slots' order does not matter: the
    block sorts them); None when fewer than k or more than CAP are (the kernel then streams again from -inf)."""
    lo, hi = c0 * CHUNK, min(c1 * CHUNK, x.size)
    ids = lo + np.flatnonzero(x[lo:hi] >= est)
    return make_keys(x[ids], ids) if k <= ids.size <= CAP else None


def _stream(x: np.ndarray, c0: int, c1: int, k: int, vw: int, rng: np.random.Generator, dev: Device) -> np.ndarray:
    """Stream.consume over chunks [c0, c1): admission from first_bound, prunes at the mark."""
    held, thr = np.zeros(0, U64), np.float32(-np.inf)
    for c in range(c0, c1):
        vw_c = vw if c < x.size // CHUNK else 1          # the tail chunk goes through scalar loads
        if c == c0 and dev.bounds:
            thr = first_bound(x, c, vw_c, k)
        held = np.concatenate([held, _admit(x, c, vw_c, thr, rng, dev)])
        if held.size > (min(COMPACT_AT, max(2 * k, MARK_MIN)) if dev.bounds else COMPACT_AT):
            held, t, kept, _ = prune(held, k, k // 2, rng, dev)
            tv = value_of(t >> 32)
            thr = np.nextafter(tv, np.float32(np.inf)) if kept == k else tv   # strict after an exact prune
    return held


def stream_block(x: np.ndarray, c0: int, c1: int, k: int, vw: int, rng: np.random.Generator, dev: Device,
                 stats: dict | None = None, fixed: bool = False):
    """topk_kernel for one (row, split) block over chunks [c0, c1) of the row x (float32 [V]). fixed (the launcher's
    kFix kernel): on >= SAMPLE_MIN_CHUNKS vector chunks one fixed-threshold stream from bisect_estimate, else (or
    when it does not hold k to CAP keys) the exact stream from -inf, counted in stats['restreams']. Otherwise the
    exact stream. The end sorts (the radix and bitonic sorts give the same order)."""
    cv = max(c0, min(c1, x.size // CHUNK if vw > 1 else 0))
    finish = finish_by_rank if k <= SMALL_K_MAX else _finish_sorted
    held = None
    if fixed and cv - c0 >= SAMPLE_MIN_CHUNKS:
        est = bisect_estimate(x, c0, cv, k, vw)
        held = fixed_stream(x, c0, c1, k, est) if est > -np.inf else None
        if held is None and stats is not None:
            stats["restreams"] = stats.get("restreams", 0) + 1
    if held is None:
        held = _stream(x, c0, c1, k, vw, rng, dev)
    return finish(held, k, rng, dev)


def uses_fixed(vocab: int, k: int, vw: int, cps: int, dev: Device) -> bool:
    """launch_topk_shipped's choice of the kFix kernel: k above SMALL_K_MAX, vector loads, and blocks of at least
    SAMPLE_MIN_CHUNKS vector chunks (dev.bounds=False models older code: never)."""
    return dev.bounds and k > SMALL_K_MAX and vw > 1 and min(cps, vocab // CHUNK) >= SAMPLE_MIN_CHUNKS


def merge(parts: np.ndarray, k: int, rng: np.random.Generator, dev: Device) -> np.ndarray:
    """merge_kernel since round 4 (2026-12-01 s5): the top k of the splits' sorted, 0-padded lists, sorted
    descending (merge_sorted_lists, a tree of bitonic merges; its own code runs on the host in
    tests/test_tree_build_merge.py). dev.bounds=False: the round-2 merge (admission from key 1, exact prunes at
    COMPACT_AT, finish_sorted), which the unguarded tie stop could break."""
    if dev.bounds:
        return np.sort(parts)[::-1][:k].copy()
    held, thr = np.zeros(0, U64), 1
    for base in range(0, parts.size, CHUNK):
        step = np.zeros(CHUNK, U64)
        seg = parts[base:base + CHUNK]
        step[:seg.size] = seg
        per_tid = step.reshape(PER, THREADS).T                      # [THREADS, PER]
        rank = _warp_rank(1, rng, dev)[0]
        for w in np.argsort(rank):
            blk = per_tid[w * 32:(w + 1) * 32].ravel()
            held = np.concatenate([held, blk[blk >= U64(thr)]])
        if held.size > COMPACT_AT:
            held, t, _, _ = prune(held, k, 0, rng, dev)
            thr = max(thr, t)
    return _finish_sorted(held, k, rng, dev)


def plan(rows: int, vocab: int, k: int, forced: int = 0, sms: int = H200_SMS) -> tuple[int, int]:
    """tree_build_topk_plan: (splits, chunks_per_split)."""
    nchunks = -(-vocab // CHUNK)
    fill = max(1, sms * 4 // max(rows, 1))
    want = forced if forced > 0 else min(fill, MAX_AUTO_SPLITS, max(2, 8192 // max(k, 1)))
    cps = -(-nchunks // max(1, min(want, nchunks)))
    return -(-nchunks // cps), cps


def topk_tokens(x: np.ndarray, k: int, forced: int, dev: Device, elem_bytes: int,
                stats: dict | None = None, plan_rows: int = 0) -> np.ndarray:
    """tree_build_topk's top_tok for logits x [rows, V] (values exactly float32): [rows, k] int64. plan_rows: the
    launch's rows when x is one request of a batch (the plan counts the whole batch's rows)."""
    rows, V = x.shape
    splits, cps = plan(plan_rows or rows, V, k, forced)
    vw = 16 // elem_bytes if (V * elem_bytes) % 16 == 0 else 1      # 16-byte vectors when rows stay aligned
    nchunks = -(-V // CHUNK)
    rng = np.random.default_rng(dev.seed)
    out = np.zeros((rows, k), np.int64)
    for r in range(rows):
        xr = x[r].astype(np.float32)
        fixed = uses_fixed(V, k, vw, cps, dev)
        parts = [stream_block(xr, s * cps, min(nchunks, (s + 1) * cps), k, vw, rng, dev, stats, fixed)
                 for s in range(splits)]
        keys = parts[0] if splits == 1 else merge(np.concatenate(parts), k, rng, dev)
        out[r] = (~(keys & U64(0xFFFFFFFF)).astype(np.uint32)).astype(np.int64)
    return out
