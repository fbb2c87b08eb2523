"""GPU tests of the tree_verify_mla CUDA kernel, all four MMA paths (the seesaw, ping-pong and lock-step wgmma on
sm_90, mma.sync), and the seesaw's tail plan, against the float64
numpy reference (kdbench.references.tree_verify_mla): ragged prefixes, chain / bushy / padded trees, NaN-filled
unused cache rows, poisoned outputs, and the argument checks of the torch glue. Skipped without a CUDA GPU."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from kdbench.check import compare
from kdbench.config import Tolerance
from kdbench.references.tree_verify_mla import pack_anc_bits, tree_verify_mla_batch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: tree_verify_mla kernel")]

SCALE = 0.130861          # Kimi K2's softmax scale (YaRN factor 32), notes/mla_moe.md §0
D_QK, D_V = 576, 512
TRIALS = 2                # fresh inputs per trial; seed = 1000 * case.seed + trial
# Error budget per o_lat element: bf16 P in the PV product (2^-9 relative per term, random) plus the bf16
# output rounding (2^-9 relative): a few 1e-3 absolute at |o| ~ 1; a lane-level emulation of the kernel
# gave 1.8e-3 relative L2 and max abs 8e-3 here. No element may fall outside; lse (fp32 scores of
# identical bf16 inputs) is the sensitive detector of a wrong mask bit.
O_TOL = Tolerance(rtol=2e-2, atol=1e-2, rel_l2=1e-2, max_outside_pct=0.0)
LSE_TOL = Tolerance(rtol=1e-4, atol=1e-4, rel_l2=1e-5)   # fp32 scores of identical bf16 inputs


@dataclass(frozen=True)
class Case:
    seed: int
    nodes: int                       # T
    heads: int                       # H
    past_lens: tuple[int, ...]       # one per request: batch = len(past_lens)
    tree: str = "bushy"              # "chain" | "bushy" (random parent among earlier nodes)
    pad: tuple[tuple[int, int], ...] = ()   # (request, node) rows turned into padding (all-zero anc)
    heads_checked: tuple[int, ...] | None = None  # reference on these heads only (big cases); None = all
    values: str = "normal"           # "normal" | "ties" (values in {-1, -0.5, 0, 0.5, 1}: many equal scores)

    @property
    def batch(self) -> int:
        return len(self.past_lens)

    def __str__(self) -> str:
        return f"B{self.batch}-T{self.nodes}-H{self.heads}-past{'_'.join(map(str, self.past_lens))}-{self.tree}"


CORRECTNESS = [
    Case(1, 7, 16, (63,), pad=((0, 6),)),
    Case(2, 7, 8, (1, 63, 4097), pad=((1, 3),)),                      # ragged batch, split-KV path
    Case(3, 64, 64, (4097,), heads_checked=(0, 17, 63)),
    Case(4, 65, 16, (63, 4097, 1), pad=((2, 64),)),                   # 2 mask words, padding in word 1
    Case(5, 129, 8, (63,), tree="chain"),
    Case(6, 129, 128, (4097,), heads_checked=(0, 64, 127)),
    Case(7, 64, 128, (1, 63, 4097), tree="chain", heads_checked=(0, 77, 127)),
    Case(8, 16, 8, (4097,)),                                          # batch 1, H 8, T 16: must split KV
    Case(9, 1, 64, (63, 1, 4097), tree="chain"),                      # T = 1: plain decode rows
    # Ping-pong parity: 2, 3, 3, 4, 5 KV tiles per request (one split): each warpgroup's last own tile, the
    # trailing remote tile and the buffer refill of tile i + 2 in every combination; padding mid-request.
    Case(10, 65, 16, (1, 64, 127, 191, 255), pad=((3, 40),)),
    Case(11, 17, 64, (3000,), heads_checked=(0, 31, 63)),             # ~7 splits of 6-7 tiles: odd counts
]
CORNERS = [
    Case(20, 1, 8, (1,), tree="chain"),                               # boundary: budget 1, context 1
    Case(21, 5, 3, (70, 2, 130)),                                     # odd H: M-tiles split nodes mid-head
    Case(22, 1025, 1, (63,)),                                         # T = 1025: 17 words, 17 tail tiles
    Case(23, 65, 16, (200,), values="ties"),                          # tie-heavy scores
    Case(24, 3, 64, (5,), pad=((0, 0), (0, 1), (0, 2))),              # every node padding: o 0, lse -inf
    Case(25, 1, 16, (0, 63, 64, 1000)),                               # T 1: tails of 1, 64, 1 and 41 rows (seesaw's
]                                                                     # shifted tail box from row -63, 0, 1, 937)


def _is_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _smem_optin() -> int:
    if not torch.cuda.is_available():
        return 0
    return int(getattr(torch.cuda.get_device_properties(0), "shared_memory_per_block_optin", 0))


KERNEL_SMEM = 231_568   # Q + two KV stages + P + exchange + 1 KB alignment (+ 144 B of mbarriers: seesaw; plans/0004)
BIG_SMEM = pytest.mark.skipif(0 < _smem_optin() < KERNEL_SMEM, reason=(
    f"the kernel needs {KERNEL_SMEM} B of shared memory per block (H100/H200 class); this GPU allows "
    f"{_smem_optin()} B and the glue refuses it by name"))

SM90_ONLY = pytest.mark.skipif(not _is_sm90(), reason="the wgmma paths exist on compute capability 9.0 (H100/H200) only")
IMPLS = [pytest.param("mma", id="mma"), pytest.param("wgmma", id="wgmma", marks=SM90_ONLY),
         pytest.param("pingpong", id="pingpong", marks=SM90_ONLY), pytest.param("seesaw", id="seesaw", marks=SM90_ONLY)]


@pytest.fixture(scope="module")
def ext():
    from kdbench.backends import cuda_build
    return cuda_build.load()   # raises with the reason when the build fails: that is a test failure here


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to bf16 and back to float64, so the reference reads exactly the values the kernel reads."""
    return torch.from_numpy(x).to(torch.bfloat16).to(torch.float64).numpy()


def _visibility(case: Case, rng: np.random.Generator) -> np.ndarray:
    """[B, T, T] ancestor-or-self bits; padded rows all False."""
    t = case.nodes
    vis = np.zeros((case.batch, t, t), dtype=bool)
    for b in range(case.batch):
        parents = np.arange(-1, t - 1) if case.tree == "chain" else np.array(
            [-1] + [int(rng.integers(0, i)) for i in range(1, t)])
        vis[b] = np.eye(t, dtype=bool)
        for i in range(1, t):
            vis[b, i, :i] = vis[b, parents[i], :i]
    for b, i in case.pad:
        vis[b, i] = False
    return vis


def make_inputs(case: Case, seed: int) -> dict:
    """q [B,T,H,576], kv [B,S,576] (bf16 values as float64; NaN in every row >= past + T), past [B], anc [B,T,W]."""
    rng = np.random.default_rng(seed)
    past = np.array(case.past_lens, dtype=np.int32)
    n_kv = int(past.max()) + case.nodes + 37          # unused slack rows, not a multiple of 64
    draw = ((lambda shape: rng.integers(-2, 3, shape) / 2.0) if case.values == "ties"
            else (lambda shape: rng.standard_normal(shape)))
    q = _bf16(draw((case.batch, case.nodes, case.heads, D_QK)))
    kv = _bf16(draw((case.batch, n_kv, D_QK)))
    for b in range(case.batch):
        kv[b, past[b] + case.nodes:] = np.nan
    return {"q": q, "kv": kv, "past_lens": past, "anc": pack_anc_bits(_visibility(case, rng))}


def _poison_allocator(value: float, nbytes: int) -> None:
    """Fill and free caching-allocator memory so the kernel's outputs start as `value`, not stale data."""
    junk = torch.full((max(1, nbytes // 4),), value, dtype=torch.float32, device="cuda")
    del junk


def run_kernel(ext, inputs: dict, poison: float, impl: str) -> tuple[np.ndarray, np.ndarray]:
    q = torch.from_numpy(inputs["q"]).to("cuda", torch.bfloat16)
    kv = torch.from_numpy(inputs["kv"]).to("cuda", torch.bfloat16)
    past = torch.from_numpy(inputs["past_lens"]).to("cuda")
    anc = torch.from_numpy(inputs["anc"].view(np.int64)).to("cuda")
    rows = q.numel() // D_QK
    _poison_allocator(poison, 2 * rows * (D_V * 2 + 4) + (64 << 20))   # outputs, split scratch, slack
    o_lat, lse = ext.tree_verify_mla(q, kv, past, anc, SCALE, impl)
    torch.cuda.synchronize()   # surfaces asynchronous launch errors here
    return o_lat.float().cpu().numpy().astype(np.float64), lse.cpu().numpy().astype(np.float64)


def assert_agree(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], where: str) -> None:
    """Two runs (o_lat, lse) of the same inputs that differ only in the fp32 accumulation or merge order: the same
    -inf (padding) and non-finite rows, lse within 1e-4 elsewhere (fp32 scores of identical bf16 inputs), o_lat within
    a bf16 rounding step; a wrong descriptor, swizzle, mask, handed-over max or partial gives O(1) differences."""
    (o_a, lse_a), (o_b, lse_b) = a, b
    assert np.array_equal(np.isneginf(lse_a), np.isneginf(lse_b)), f"{where}: different padding (-inf lse) rows"
    assert np.array_equal(np.isfinite(lse_a), np.isfinite(lse_b)), f"{where}: different non-finite lse rows"
    real = np.isfinite(lse_b)
    assert np.max(np.abs(lse_a[real] - lse_b[real])) < 1e-4, f"{where}: lse differs"
    assert np.max(np.abs(o_a - o_b)) < 2e-2, f"{where}: o_lat differs"


def reference(case: Case, inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    heads = list(range(case.heads)) if case.heads_checked is None else list(case.heads_checked)
    return tree_verify_mla_batch(inputs["q"][:, :, heads], inputs["kv"], inputs["past_lens"], inputs["anc"], SCALE)


def check_case(ext, case: Case, trial: int, impl: str) -> None:
    seed = 1000 * case.seed + trial
    where = f"{impl} {case} seed {seed}"
    inputs = make_inputs(case, seed)
    o1, lse1 = run_kernel(ext, inputs, poison=float("nan"), impl=impl)
    o2, lse2 = run_kernel(ext, inputs, poison=7.0, impl=impl)
    # Coverage and determinism: every element written (no poison survives), identical across runs.
    assert not np.isnan(o1).any() and not np.isnan(lse1).any(), f"{where}: NaN in output (unwritten or leaked)"
    assert np.array_equal(o1, o2) and np.array_equal(lse1, lse2), f"{where}: outputs differ between runs"
    pad = ~inputs["anc"].any(axis=-1)                   # [B, T] padding nodes
    assert (o1[pad] == 0).all(), f"{where}: padding rows must give o_lat = 0"
    assert np.isneginf(lse1[pad]).all(), f"{where}: padding rows must give lse = -inf, got {lse1[pad][:2]}"
    assert np.isfinite(lse1[~pad]).all(), f"{where}: real rows must give a finite lse"
    heads = list(range(case.heads)) if case.heads_checked is None else list(case.heads_checked)
    o_ref, lse_ref = reference(case, inputs)
    for name, got, want, tol in (("o_lat", o1[:, :, heads], o_ref, O_TOL),
                                 ("lse", lse1[:, :, heads], lse_ref, LSE_TOL)):
        res = compare(got, want, tol)
        assert res.passed, (f"{where} {name}: rel L2 {res.rel_l2:.3e}, max abs {res.max_abs:.3e}, "
                            f"{res.pct_outside:.3f}% outside, NaN/inf mismatches {res.n_nan}, worst {res.worst}")


@BIG_SMEM
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("trial", range(TRIALS))
@pytest.mark.parametrize("case", CORRECTNESS, ids=str)
def test_matches_reference(ext, case, trial, impl):
    check_case(ext, case, trial, impl)


@BIG_SMEM
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CORNERS, ids=str)
def test_corner_cases(ext, case, impl):
    check_case(ext, case, trial=0, impl=impl)


@BIG_SMEM
@SM90_ONLY
@pytest.mark.parametrize("impl", ["wgmma", "pingpong", "seesaw"])
def test_wgmma_paths_agree_with_mma(ext, impl):
    """Same inputs through a wgmma path and mma.sync: only the fp32 accumulation order differs, so lse agrees to
    ~1e-5 and o_lat to a bf16 rounding step; a wrong descriptor, swizzle or handed-over max gives O(1) differences."""
    case = Case(40, 65, 64, (4097, 63, 900), pad=((1, 64),))
    inputs = make_inputs(case, seed=40)
    assert_agree(run_kernel(ext, inputs, poison=float("nan"), impl=impl),
                 run_kernel(ext, inputs, poison=float("nan"), impl="mma"), f"{impl} vs mma")


@BIG_SMEM
@pytest.mark.parametrize("impl", IMPLS)
def test_nan_in_unused_rows_never_leaks(ext, impl):
    """The last tile of each request straddles NaN rows; NaN must not reach any output (select, not multiply)."""
    case = Case(30, 3, 16, (62, 125, 1))              # past + T = 65, 128, 4: tiles end inside NaN rows
    inputs = make_inputs(case, seed=30)
    assert np.isnan(inputs["kv"][:, -1]).all()
    o, lse = run_kernel(ext, inputs, poison=0.0, impl=impl)
    assert np.isfinite(o).all() and np.isfinite(lse).all(), "NaN from unused cache rows leaked into outputs"


@BIG_SMEM
@SM90_ONLY
def test_seesaw_matches_pingpong_past_the_cache_end(ext):
    """past + T > S breaks the caller's promise: the request's last tree columns lie past the cache. v3's clamped
    loads score them 0; v4's TMA map is [batch][S][576], so rows past S arrive as zeros there too (all 9 column
    blocks, rope included) and give the same numbers. The other request stays exact against the reference."""
    case = Case(41, 65, 16, (200, 30))
    inputs = make_inputs(case, seed=41)
    inputs["kv"] = np.ascontiguousarray(inputs["kv"][:, :case.past_lens[0] + case.nodes - 20])  # request 0: 20 past S
    o_s, lse_s = run_kernel(ext, inputs, poison=float("nan"), impl="seesaw")
    o_p, lse_p = run_kernel(ext, inputs, poison=float("nan"), impl="pingpong")
    assert np.isfinite(o_s).all() and np.isfinite(lse_s).all()
    assert_agree((o_s[0], lse_s[0]), (o_p[0], lse_p[0]), "request 0 (past S), seesaw vs pingpong")
    o_ref, lse_ref = tree_verify_mla_batch(inputs["q"][1:], inputs["kv"][1:], inputs["past_lens"][1:],
                                           inputs["anc"][1:], SCALE)   # request 1 alone: 30 + 65 <= S = 245
    for got, want, tol in ((o_s[1:], o_ref, O_TOL), (lse_s[1:], lse_ref, LSE_TOL)):
        res = compare(got, want, tol)
        assert res.passed, f"request 1 (past 30, fits): rel L2 {res.rel_l2:.3e}, max abs {res.max_abs:.3e}"


def _tail_case(ext, seed: int, nodes: int, heads: int, past_of, min_pieces: int) -> tuple[Case, list[int]]:
    """The smallest batch whose seesaw plan on this GPU is a tail plan of >= min_pieces pieces (units = B x M-tiles
    past a whole number of waves): the case and its plan [num_splits, tail_start, tail_pieces]. The last request's last
    node is padding: its rows are in the last M-tile, a tail unit."""
    for batch in range(1, 257):
        pasts = tuple(past_of(b) for b in range(batch))
        plan = list(ext.tree_verify_mla_plan(batch, nodes, heads, max(pasts) + nodes + 37, "seesaw"))
        if plan[2] >= min_pieces:
            return Case(seed, nodes, heads, pasts, pad=((batch - 1, nodes - 1),), heads_checked=(0, heads - 1)), plan
    raise AssertionError(f"no batch up to 256 gives a tail plan of >= {min_pieces} pieces for T {nodes}, H {heads}")


@BIG_SMEM
@SM90_ONLY
@pytest.mark.parametrize("nodes, heads, past_of, min_pieces", [
    (65, 64, lambda b: (300, 1, 4000)[b % 3], 2),        # 65 M-tiles per request; 132 SMs: B 3, 63 units in 2 pieces
    (9, 64, lambda b: 1 + (97 * (14 - b)) % 1500, 4),    # 9 M-tiles; B 15: 3 units (request 14, past 1: one KV
                                                         # tile) in 22 pieces, 21 of them empty
    (65, 16, lambda b: (300, 1, 4000)[b % 3], 2),        # 16.25 M-tiles: B 8, 4 tail units (request 7, past 1) in
                                                         # 33 pieces, the last unit's M-tile with 16 real rows
], ids=["t65-2pieces", "t9-many-pieces", "t65h16-partial-mtile"])
def test_seesaw_tail_plan(ext, monkeypatch, nodes, heads, past_of, min_pieces):
    """The tail plan (the last partial wave's units in KV pieces, merged by the combine) against float64, and the
    same inputs with the plan off (KDB_TVM_TAIL=0: the uniform plan) give the same numbers to the fp32 merge order."""
    monkeypatch.delenv("KDB_TVM_TAIL", raising=False)  # the plan on, whatever the caller's environment says
    monkeypatch.delenv("KDB_TVM_SPLITS", raising=False)
    case, plan = _tail_case(ext, 50 + nodes + heads, nodes, heads, past_of, min_pieces)
    check_case(ext, case, trial=0, impl="seesaw")
    inputs = make_inputs(case, seed=1000 * case.seed)
    tail = run_kernel(ext, inputs, poison=float("nan"), impl="seesaw")
    monkeypatch.setenv("KDB_TVM_TAIL", "0")
    off = list(ext.tree_verify_mla_plan(case.batch, nodes, heads, inputs["kv"].shape[1], "seesaw"))
    assert off[2] == 0, f"KDB_TVM_TAIL=0 must turn the tail plan off, got {off} (on: {plan})"
    assert_agree(tail, run_kernel(ext, inputs, poison=float("nan"), impl="seesaw"), f"tail plan {plan} vs {off}")


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "q": a["q"].float()}, "q must be bfloat16"),
    (lambda a: {**a, "past_lens": a["past_lens"].long()}, "past_lens must be int32"),
    (lambda a: {**a, "kv": a["kv"].cpu()}, "kv must be on"),
    (lambda a: {**a, "q": a["q"].transpose(1, 2)}, "q must be contiguous"),
    (lambda a: {**a, "anc": a["anc"][:, :, :0]}, "anc must be"),
    (lambda a: {**a, "kv": a["kv"][:, :2]}, "kv length S"),
    (lambda a: {**a, "impl": "tensorcore"}, "impl must be 'auto', 'seesaw', 'pingpong', 'wgmma' or 'mma'"),
])
def test_rejects_bad_arguments(ext, change, message):
    args = {"q": torch.zeros(1, 4, 2, D_QK, dtype=torch.bfloat16, device="cuda"),
            "kv": torch.zeros(1, 20, D_QK, dtype=torch.bfloat16, device="cuda"),
            "past_lens": torch.tensor([3], dtype=torch.int32, device="cuda"),
            "anc": torch.ones(1, 4, 1, dtype=torch.int64, device="cuda"), "impl": "auto"}
    bad = change(args)
    with pytest.raises(RuntimeError, match=message):
        ext.tree_verify_mla(bad["q"], bad["kv"], bad["past_lens"], bad["anc"], SCALE, bad["impl"])
