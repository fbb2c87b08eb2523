"""CPU tests of the tree_build vocabulary pass through its numpy emulation (tests/tree_build_vocab_emulation.py):
the GPU test inputs (same seeds, same plan as on the H200) must give the reference top-K exactly for any warp
arrival order, and the unguarded tie stop that failed on the H200 on 2026-12-01 must fail here the same way."""
from __future__ import annotations

import numpy as np
import pytest

import tree_build_vocab_emulation as em
from kdbench.references import tree_build as ref
from test_tree_build import CASES, IDS, SPLIT_CASES, Case, logit_values

ELEM_BYTES = {"float32": 4, "bfloat16": 2}
ORDERS = ["random", "desc", "asc"]


def _run(case: Case, forced: int, dev: em.Device) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """(values [B, L, V], emulated top_tok per request, reference top_tok per request) for the GPU test's inputs."""
    x = logit_values(case, np.random.default_rng(case.seed))
    k = min(case.budget, case.vocab)
    rows = case.batch * case.depth  # the GPU test launches the whole batch: the plan counts its rows
    got = [em.topk_tokens(x[b], k, forced, dev, ELEM_BYTES[case.dtype], plan_rows=rows) for b in range(case.batch)]
    want = [ref.topk_logprobs(x[b], k)[1] for b in range(case.batch)]
    return x, got, want


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_emulated_topk_matches_reference(case, order):
    _, got, want = _run(case, 0, em.Device(order, seed=case.seed))
    for b in range(case.batch):
        np.testing.assert_array_equal(got[b], want[b], err_msg=f"request {b}, warp order {order}")


@pytest.mark.parametrize("case, splits", SPLIT_CASES, ids=[f"{c.vocab}-k{c.budget}-{c.logits}" for c, _ in SPLIT_CASES])
def test_emulated_forced_splits_match_reference(case, splits):
    for s in splits:
        _, got, want = _run(case, s, em.Device("random", seed=case.seed + s))
        for b in range(case.batch):
            np.testing.assert_array_equal(got[b], want[b], err_msg=f"splits {s}, request {b}")


def test_emulated_decoy_restreams_and_stays_exact():
    """The decoy case puts the sampled logits above the rest: the estimate lands above the k-th, the block
    streams again from -inf (the branch this case exists for), and the top-k is still the reference's."""
    for case in (c for c, _ in SPLIT_CASES if c.logits == "decoy"):  # bf16 and fp32
        x = logit_values(case, np.random.default_rng(case.seed))
        k, stats = min(case.budget, case.vocab), {}
        got = em.topk_tokens(x[0], k, 1, em.Device("random", seed=case.seed), ELEM_BYTES[case.dtype], stats)
        np.testing.assert_array_equal(got, ref.topk_logprobs(x[0], k)[1])
        assert stats.get("restreams", 0) == case.depth, (case.dtype, stats)


def test_emulated_fixed_stream_holds_or_streams_again():
    """The kFix kernel (k > 64, blocks of >= 8 vector chunks): normal rows hold k..CAP keys >= the estimate and
    stream once; a 9-value tie row puts thousands of logits at the estimate, overflows CAP and streams again; rows
    of fewer than 8 vector chunks never take the kernel. The top-k is the reference's in each."""
    for seed, want_restreams in ((37, 0), (38, 0), (36, 16)):
        case = next(c for c in CASES if c.seed == seed)
        x = logit_values(case, np.random.default_rng(case.seed))
        k, stats = min(case.budget, case.vocab), {}
        vw = 16 // ELEM_BYTES[case.dtype]
        assert em.uses_fixed(case.vocab, k, vw, em.plan(case.batch * case.depth, case.vocab, k)[1], em.Device())
        got = em.topk_tokens(x[0], k, 0, em.Device(seed=case.seed), ELEM_BYTES[case.dtype], stats,
                             plan_rows=case.batch * case.depth)
        np.testing.assert_array_equal(got, ref.topk_logprobs(x[0], k)[1])
        assert stats.get("restreams", 0) == want_restreams, (case, stats)
    assert not em.uses_fixed(32000, 256, 8, 8, em.Device())  # 7 vector chunks
    assert not em.uses_fixed(163840, 64, 8, 40, em.Device())  # k 64: kBitsRank


def test_bisect_estimate_is_below_the_mth_sample():
    """bisect_estimate: at least m samples are >= it, and it is at most the m-th largest sample (so the count of
    logits >= it is at least the count >= that sample), on normal, tie, -inf and NaN-free rising rows."""
    rng = np.random.default_rng(22)
    for kind in range(4):
        x = [rng.normal(0, 3, 163840), rng.integers(-4, 5, 163840) * 0.5, np.full(163840, -1.25),
             np.where(rng.random(163840) < 0.5, -np.inf, np.linspace(-8, 8, 163840))][kind].astype(np.float32)
        for k, vw in ((65, 8), (256, 8), (1024, 4)):
            est = em.bisect_estimate(x, 0, 40, k, vw)
            sample = x[em.sample_ids(0, 40, vw)]
            m = em.sample_m(k, 40)
            assert np.sum(sample >= est) >= m and est <= np.sort(sample)[::-1][m - 1], (kind, k, est)


# The tie cases the H200 failed (gpu_tests.log of 2026-12-01 session 2) with the forced split count of the failure.
H200_FAILED = [(c, 0) for c in CASES if c.logits == "ties" and c.vocab == 163840] + [
    (c, s[0]) for c, s in SPLIT_CASES if c.logits == "ties"]


@pytest.mark.parametrize("case, forced", H200_FAILED, ids=[f"{c.vocab}-k{c.budget}-s{f}" for c, f in H200_FAILED])
def test_unguarded_tie_stop_fails_like_the_h200(case, forced):
    """The round-2 code took the tie stop after an id-bit pass: wrong members of the tied cut group are kept
    (same values as the reference, larger ids), in every warp order. Emulated with that code's admission
    (bounds=False): with first_bound fewer keys are held and some of these cases no longer reach the bad exit."""
    for order in ORDERS:
        x, got, want = _run(case, forced, em.Device(order, guarded=False, bounds=False, seed=case.seed))
        outside = np.mean([np.mean(g != w) for g, w in zip(got, want)])
        assert outside > 0.2, f"warp order {order}: only {outside:.1%} of ids differ"
        for b in range(case.batch):
            row_vals = lambda tok: np.take_along_axis(x[b], tok, axis=1)  # noqa: E731
            np.testing.assert_array_equal(row_vals(got[b]), row_vals(want[b]))   # the same tied values
            assert got[b].max() > want[b].max()                                   # taken from later ids


def _key_sets(rng: np.random.Generator):
    """(keys, k, slack) over random, 9-value bf16 ties, one repeated value, -inf; ties much wider than k + slack."""
    for t in range(120):
        n = int(rng.integers(2, 6000))
        k = int(rng.integers(1, min(n, 1024) + 1))
        kind = t % 4
        v = [rng.normal(0, 3, n), rng.integers(-4, 5, n) * 0.5, np.full(n, -1.25),
             np.where(rng.random(n) < 0.4, -np.inf, rng.normal(0, 3, n))][kind].astype(np.float32)
        if t % 2 == 0:
            v = (v.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)   # bf16 values
        ids = rng.permutation(200000)[:n]
        yield em.make_keys(v, ids), k, (k // 2 if t % 3 else 0)


@pytest.mark.parametrize("guarded", [True, False])
def test_select_kept_counts_the_keys_at_or_above_t(guarded):
    """The invariant prune() relies on (sm.count = kept): exactly `kept` keys are >= t, they include the top k,
    and keys beyond the top k tie with the k-th. Without the guard it must break on some tie-heavy set."""
    broken = 0
    for keys, k, slack in _key_sets(np.random.default_rng(7)):
        t, kept = em.radix_select_ge(keys, k, slack, em.Device(guarded=guarded))
        srt = np.sort(keys)[::-1]
        if int(np.sum(keys >= np.uint64(t))) != kept:
            broken += 1
            continue
        assert k <= kept <= k + slack and (srt[:kept] >= np.uint64(t)).all()
        assert len({int(x) >> 32 for x in srt[k - 1:kept]}) == 1
    assert (broken == 0) if guarded else (broken > 0), f"{broken} key sets with kept != count(keys >= t)"


def test_finish_by_rank_is_the_sorted_top_k():
    """finish_by_rank (to k 64 since s20): ranks of distinct keys are distinct, so writing key i at its rank gives
    the top min(k, n) sorted descending and 0-padded, as finish_sorted does; also at the 256-key limit and past it
    (finish_sorted's path), on bf16 ties, one repeated value and -inf."""
    rng = np.random.default_rng(20)
    for n in (1, 2, 15, 16, 17, 63, 64, 65, 200, 255, 256, 257, 300):
        for kind in range(4):
            v = [rng.normal(0, 3, n), rng.integers(-4, 5, n) * 0.5, np.full(n, -1.25),
                 np.where(rng.random(n) < 0.4, -np.inf, rng.normal(0, 3, n))][kind].astype(np.float32)
            v = (v.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
            keys = em.make_keys(v, rng.permutation(200000)[:n])
            for k in (1, 16, 64):
                want = np.zeros(k, np.uint64)
                top = np.sort(keys)[::-1][:k]
                want[:top.size] = top
                got = em.finish_by_rank(keys, k, rng, em.Device())
                assert np.array_equal(got, want), (n, kind, k)


def test_sample_segments_hold_rising_rows(monkeypatch):
    """The sample's 128-byte segments (sample_ids) are fine enough for rows ascending in the id: the estimate holds
    k..CAP keys and the block streams once (s23 call C); 512-byte segments put more than CAP logits above the
    estimate and stream again (call B: 11x slower on the H200), which this test sees."""
    case = next(c for c, _ in SPLIT_CASES if c.logits == "rising" and c.budget == 256 and c.seed == 52)
    x = logit_values(case, np.random.default_rng(case.seed))
    ids = em.sample_ids(0, 40, 8)
    assert ids.size == em.THREADS * em.PER and ids.max() < 163840 and np.all(np.diff(ids[:64]) == 1)
    for seg, want in ((em.SAMPLE_SEG_VECS, 0), (32, case.depth)):
        monkeypatch.setattr(em, "SAMPLE_SEG_VECS", seg)
        for k in (256, 1024):
            stats = {}
            got = em.topk_tokens(x[0], k, 1, em.Device(seed=case.seed), 2, stats)
            np.testing.assert_array_equal(got, ref.topk_logprobs(x[0], k)[1])
            assert stats.get("restreams", 0) == want, (seg, k, stats)
