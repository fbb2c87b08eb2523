"""The routed experts (plans/0015): the device-side block plan and the kernels' block walk (emulate) against the
float64 reference on CPU; the moe_experts family end to end on CPU (loop, grouped); the Triton experts and the
FlashInfer peer on a GPU (fresh seeded inputs, odd row counts, one expert taking every row, empty experts), a
CUDA-graph replay of the Triton path on new routing, and the routing ties through the model's dispatch."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from kdbench import config, families, runner, shapes
from kdbench.backends import registry
from kdbench.model import moe as tmoe
from kdbench.model import moe_plan, moe_triton
from kdbench.model import weights as tw
from kdbench.references import model as ref
from kdbench.references import moe as ref_moe
from kdbench.references.model_config import get_preset

FAM = families.get("moe_experts")
needs_triton = pytest.mark.skipif(not (torch.cuda.is_available() and moe_triton.AVAILABLE),
                                  reason="needs a CUDA GPU with Triton (the Triton experts); the block plan and "
                                         "its walk are tested on CPU in float64")


@dataclasses.dataclass(frozen=True)
class _Case:       # the two fields the family reads from a config.Case
    shape: shapes.MoeExpertsShape
    dtype: str


def _case(rows, routing="uniform", dtype="float32", hidden=72, inter=40, experts=24, topk=5):
    return _Case(shapes.MoeExpertsShape(rows, hidden, inter, experts, topk, routing), dtype)


def _hot_slots(rng: np.random.Generator, E: int, S: int) -> np.ndarray:
    """[S] expert of each slot: 60 % on 3 hot experts, the rest uniform, so several experts stay empty."""
    hot = rng.integers(0, E, size=3)
    return np.where(rng.random(S) < 0.6, rng.choice(hot, S), rng.integers(0, E, S))


@pytest.mark.parametrize("seed", [3, 11, 29])
@pytest.mark.parametrize("bm", [1, 4, 16])
def test_block_plan_covers_every_slot_once_with_its_expert(seed, bm):
    rng = np.random.default_rng(seed)
    E, S = int(rng.integers(2, 40)), int(rng.integers(1, 300))
    flat = _hot_slots(rng, E, S)
    plan = moe_plan.block_plan(torch.from_numpy(flat), E, bm)
    order = plan.order.numpy()
    assert sorted(order.tolist()) == list(range(S)) and (np.diff(flat[order]) >= 0).all()
    assert plan.blk_e.shape[0] == moe_plan.max_blocks(S, E, bm)
    covered = np.zeros(S, dtype=int)
    for e, r0, r1 in zip(plan.blk_e.tolist(), plan.blk_r0.tolist(), plan.blk_r1.tolist()):
        if e < 0:
            continue
        rows = np.arange(r0, min(r0 + bm, r1))
        assert len(rows) > 0 and (flat[order[rows]] == e).all()
        covered[rows] += 1
    assert (covered == 1).all()
    used = (plan.blk_e >= 0).sum().item()
    assert used == sum(-(-c // bm) for c in np.bincount(flat, minlength=E)), "one block per bm slots of an expert"
    assert (plan.blk_e[used:] == -1).all(), "used blocks first, the static tail unused"


@pytest.mark.parametrize("rows,routing", [(1, "uniform"), (7, "same"), (33, "skewed"), (50, "uniform")])
@pytest.mark.parametrize("bm", [16, 3])
def test_the_kernels_block_walk_equals_the_float64_reference(rows, routing, bm):
    """emulate() computes block by block from the plan what the Triton kernels do (slot-order store of the
    weighted down product, sum over k after); in float64 it must match the family's numpy reference."""
    case = _case(rows, routing)
    inputs = FAM.make_inputs(case, seed=1000 + rows)
    want = FAM.reference(inputs, case)["y"]
    x, idx, wts, w1, w2, w3 = FAM._on_device(inputs, "cpu", "float32")
    got = moe_plan.emulate(x.double(), idx, wts.double(), w1.double(), w2.double(), w3.double(), bm).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def _shared_expert(inter, hidden, seed, scale=0.1):
    """A shared expert (w1 [mi, d], w2 [d, mi], w3 [mi, d]) of fresh seeded float64 values, never zero."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(sh) * scale for sh in ((inter, hidden), (hidden, inter), (inter, hidden))]


@pytest.mark.parametrize("rows,routing", [(1, "uniform"), (7, "same"), (50, "skewed")])
@pytest.mark.parametrize("bm", [16, 3])
def test_the_block_walk_with_the_shared_expert_as_expert_e_equals_the_reference(rows, routing, bm):
    """The shared expert as slot k (expert index E, weight 1) of every token: the routed sum plus its SwiGLU."""
    case = _case(rows, routing)
    inputs = FAM.make_inputs(case, seed=2000 + rows)
    sh = _shared_expert(40, 72, rows)
    want = FAM.reference(inputs, case)["y"] + ref_moe.swiglu(inputs["x"].astype(np.float64), *sh)
    x, idx, wts, w1, w2, w3 = FAM._on_device(inputs, "cpu", "float32")
    got = moe_plan.emulate(x.double(), idx, wts.double(), w1.double(), w2.double(), w3.double(), bm,
                           shared=tuple(torch.from_numpy(m) for m in sh)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_moe_forward_hands_the_shared_expert_to_an_op_that_fuses_it(monkeypatch):
    """The wiring of model/moe.py on CPU: an op marked fuses_shared gets the shared expert (here the block walk,
    float64) and the layer equals the float64 reference layer; an op without the mark gets the routed slots only."""
    cfg = dataclasses.replace(get_preset("tiny"), hidden=48, moe_intermediate=24, n_routed_experts=12)
    w = tw.from_numpy(ref.init_weights(cfg, 4), "cpu", torch.float64)
    x = torch.randn(9, cfg.hidden, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    seen = []

    def fused(x, idx, wts, w1, w2, w3, shared=None):
        seen.append(shared is not None)
        return moe_plan.emulate(x, idx, wts, w1, w2, w3, 4, shared=shared)
    fused.fuses_shared = True
    monkeypatch.setattr(tmoe, "experts_op", lambda *a: fused)
    want = ref_moe.moe_forward(tw.to_numpy(w), cfg, 1, x.numpy())
    np.testing.assert_allclose(tmoe.moe_forward(w, cfg, 1, x).numpy(), want, rtol=1e-9, atol=1e-11)
    del fused.fuses_shared
    np.testing.assert_allclose(tmoe.moe_forward(w, cfg, 1, x).numpy(), want, rtol=1e-9, atol=1e-11)
    assert seen == [True, False]


def test_auto_dispatch_resolves_to_a_path_that_runs_here():
    w = torch.zeros(3, 4, 8)
    assert tmoe.resolve_dispatch("loop", torch.zeros(2, 8), w) == "loop"
    assert tmoe.resolve_dispatch("auto", torch.zeros(2, 8, dtype=torch.float64), w.double()) == "loop"
    want = "grouped" if tmoe._grouped_available(torch.zeros(2, 8), w) else "loop"
    assert tmoe.resolve_dispatch("auto", torch.zeros(2, 8), w) == want, "no triton on a CPU tensor"


def test_selection_margin_is_the_kth_minus_the_next_score_and_the_layer_logs_it():
    biased = torch.tensor([[0.9, 0.1, 0.5, 0.45], [0.2, 0.2, float("-inf"), 0.7]])
    torch.testing.assert_close(tmoe.selection_margin(biased, 2), torch.tensor([0.05, 0.0]))
    assert torch.isinf(tmoe.selection_margin(biased, 4)).all(), "nothing left to flip with"
    cfg = dataclasses.replace(get_preset("tiny"), hidden=48, moe_intermediate=24, n_routed_experts=12)
    w = tw.from_numpy(ref.init_weights(cfg, 4), "cpu", torch.float64)
    x = torch.randn(5, cfg.hidden, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    log = []
    tmoe.moe_forward(w, cfg, 1, x, margin_log=log)
    s = tmoe.biased_scores(tmoe.router_scores(x, w["layers.1.gate"]), w["layers.1.gate_bias"], cfg)
    top = torch.sort(s, descending=True).values
    k = cfg.n_experts_per_tok
    assert log[0][0] == 1 and torch.equal(log[0][1], top[:, k - 1] - top[:, k])


def test_with_shared_appends_one_slot_of_weight_one_per_token():
    idx, wts = torch.tensor([[3, 1], [0, 2]]), torch.tensor([[0.25, 0.5], [0.75, 0.125]])
    i2, w2 = moe_plan.with_shared(idx, wts, 4)
    assert i2.tolist() == [[3, 1, 4], [0, 2, 4]] and w2.tolist() == [[0.25, 0.5, 1.0], [0.75, 0.125, 1.0]]
    plan = moe_plan.block_plan(i2.reshape(-1), 5, 16)
    assert plan.blk_e.tolist()[:5] == [0, 1, 2, 3, 4], "the shared expert is block-planned like the others"


def test_inputs_touch_the_experts_the_routing_says():
    same = FAM.make_inputs(_case(9, "same"), seed=5)
    assert len(same["touched"]) == 5 and (same["idx"] == same["idx"][0]).all()
    skew = FAM.make_inputs(_case(40, "skewed", experts=300), seed=5)
    uniform = FAM.make_inputs(_case(40, "uniform", experts=300), seed=5)
    assert len(skew["touched"]) < len(uniform["touched"]) - 40, (len(skew["touched"]), len(uniform["touched"]))
    assert all(len(set(r)) == 5 for r in skew["idx"].tolist())
    np.testing.assert_allclose(skew["weights"].sum(1), 2.827, rtol=1e-6)
    again = FAM.make_inputs(_case(40, "skewed", experts=300), seed=5)
    assert all(np.array_equal(skew[k], again[k]) for k in ("x", "idx", "w1")), "a seed gives the same inputs"


@pytest.mark.parametrize("backend", ["moe_loop", "moe_grouped"])
def test_torch_backends_match_the_reference_on_cpu(backend):
    for rows, routing in ((1, "uniform"), (13, "same"), (31, "skewed")):
        case = _case(rows, routing)
        inputs = FAM.make_inputs(case, seed=rows)
        if backend == "moe_grouped" and not tmoe._grouped_available(*FAM._on_device(inputs, "cpu", "float32")[::3]):
            pytest.skip("torch._grouped_mm does not run on CPU float32 in this torch build")
        res = FAM.check(FAM.run(backend, inputs, case, "cpu"), FAM.reference(inputs, case),
                        config.Tolerance(rtol=1e-4, atol=1e-5))
        assert res.passed, (rows, routing, res.worst)


def test_a_kernel_scenario_runs_the_family_and_skips_triton_on_cpu(tmp_path):
    path = tmp_path / "moe.yaml"
    path.write_text("""
name: moe-cpu
kind: kernel
cases:
  - name: rows
    family: moe_experts
    shape: {hidden: 48, inter: 24, experts: 16, topk: 4}
    sweep: {shape.rows: [1, 9]}
    backends: [numpy_ref, moe_loop, moe_triton]
    trials: 2
    tolerance: {rtol: 0.0001, atol: 0.00001}
    timing: {warmup: 1, repeat: 3}
""")
    recs = runner.run_scenarios([str(path)], str(tmp_path / "run"), "cpu", progress=False).records
    by = {(r.case, r.backend): r for r in recs}
    assert by[("rows[rows=9]", "moe_loop")].status == "pass"
    assert by[("rows[rows=9]", "moe_loop")].bytes_moved > 0
    assert by[("rows[rows=9]", "moe_triton")].status == "skipped"
    assert "cuda" in by[("rows[rows=9]", "moe_triton")].reason


def test_bad_moe_dispatch_names_the_key_and_the_modes(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: b\nkind: e2e\ncases:\n  - name: c\n    shape: {model: tiny, moe: fast}\n")
    with pytest.raises(config.ScenarioError, match=r"moe: got 'fast', expected one of auto, loop, grouped, triton"):
        config.load(path)
    assert tmoe.DISPATCH_MODES == registry.moe_dispatch_modes()


def test_unavailable_dispatch_says_why():
    cfg = dataclasses.replace(get_preset("tiny"), hidden=32, moe_intermediate=16, n_routed_experts=8)
    w = tw.from_numpy(ref.init_weights(cfg, 2), dtype=torch.float32)
    x = torch.randn(3, cfg.hidden, generator=torch.Generator().manual_seed(2))
    if torch.cuda.is_available():
        pytest.skip("CPU-only check: here the triton dispatch may run")
    with pytest.raises(ValueError, match="moe dispatch 'triton' cannot run here: the moe_triton backend needs"):
        tmoe.moe_forward(w, cfg, 1, x, dispatch="triton")


# ---- GPU: the Triton experts (bf16), the peer, graph capture, routing ties through the model -----------------

def _bf16_check(backend, case, seed, rel_l2=6e-3):
    inputs = FAM.make_inputs(case, seed)
    got = FAM.run(backend, inputs, case, "cuda")["y"]
    want = FAM.reference(inputs, case)["y"]
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert np.isfinite(got).all() and err < rel_l2, (backend, case.shape, seed, err)
    return err


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("rows,routing,hidden,inter", [
    (1, "uniform", 256, 128), (7, "same", 200, 96), (33, "skewed", 256, 128), (129, "uniform", 320, 192),
    (131, "same", 128, 64), (1100, "skewed", 192, 64), (1700, "uniform", 192, 64)])
# slots = rows x 5: BM 16 up to 1024 slots, 32 at 5500, 64 (and 128-column programs) at 8500
@pytest.mark.parametrize("seed", [7, 8])
def test_triton_experts_match_the_float64_reference(rows, routing, hidden, inter, seed):
    _bf16_check("moe_triton", _case(rows, routing, "bfloat16", hidden, inter, experts=64), seed)


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("rows,routing,hidden,inter", [
    (1, "uniform", 256, 128), (7, "same", 200, 96), (129, "skewed", 320, 192), (1100, "uniform", 192, 64),
    (1700, "skewed", 192, 64)])
def test_triton_experts_with_the_shared_expert_fused_match_float64(rows, routing, hidden, inter):
    """The shared expert in the expert launches (slot k, expert E; rows x 6 slots): BM 16 at up to 1024 slots, 32 at
    6600, 64 with 128-column programs at 10200; a K tail (hidden 200)."""
    case = _case(rows, routing, "bfloat16", hidden, inter, experts=64)
    inputs = FAM.make_inputs(case, 40 + rows)
    sh = [torch.from_numpy(m).to("cuda", torch.bfloat16) for m in _shared_expert(inter, hidden, rows, hidden ** -0.5)]
    x, idx, wts, w1, w2, w3 = FAM._on_device(inputs, "cuda", "bfloat16")
    y = moe_triton.experts(x, idx, wts, w1, w2, w3, shared=tuple(sh))
    want = FAM.reference(inputs, case)["y"] + ref_moe.swiglu(x.double().cpu().numpy(),
                                                            *(m.double().cpu().numpy() for m in sh))
    got = y.double().cpu().numpy()
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert np.isfinite(got).all() and err < 6e-3, (rows, err)


@pytest.mark.gpu
@needs_triton
def test_auto_dispatch_is_triton_for_bf16_on_the_gpu_and_grouped_for_float32():
    w = torch.zeros(3, 4, 8, device="cuda")
    assert tmoe.resolve_dispatch("auto", torch.zeros(2, 8, device="cuda").bfloat16(), w.bfloat16()) == "triton"
    assert tmoe.resolve_dispatch("auto", torch.zeros(2, 8, device="cuda"), w) in ("grouped", "loop")


@pytest.mark.gpu
@needs_triton
def test_triton_experts_refuse_a_shared_expert_of_another_width():
    x = torch.randn(3, 64, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4, 32, 64, dtype=torch.bfloat16, device="cuda")
    s1 = torch.randn(48, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="the shared expert must be one routed expert's shape"):
        moe_triton.experts(x, torch.zeros(3, 2, dtype=torch.int64, device="cuda"), torch.ones(3, 2, device="cuda"),
                           w, w.transpose(1, 2).contiguous(), w, shared=(s1, s1.T.contiguous(), s1))


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("seed", [1, 2])
def test_triton_error_is_no_worse_than_torch_grouped(seed):
    case = _case(65, "uniform", "bfloat16", 512, 256, experts=96, topk=8)
    ours, theirs = _bf16_check("moe_triton", case, seed), _bf16_check("moe_grouped", case, seed)
    assert ours <= 1.5 * theirs + 1e-4, (ours, theirs)


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("rows,routing,hidden,inter", [
    (1, "uniform", 256, 128), (33, "skewed", 200, 96), (129, "same", 320, 192), (520, "uniform", 256, 128)])
def test_liger_peer_matches_the_reference_when_it_runs(rows, routing, hidden, inter):
    """Liger-Kernel's fused MoE (the Triton peer) against float64, at odd hidden sizes (a K tail) and one-expert-set
    routing; twice in a row at each size, the same bits (its one pinned config: liger_moe sets Liger's own
    LIGER_FUSED_MOE_AUTOTUNE=0)."""
    why = registry.get("moe_liger").unavailable("cuda")
    if why:
        pytest.skip(why)
    case = _case(rows, routing, "bfloat16", hidden, inter, experts=64)
    first = _bf16_check("moe_liger", case, 4)
    assert _bf16_check("moe_liger", case, 4) == first


@pytest.mark.gpu
@needs_triton
def test_flashinfer_peer_matches_the_reference_when_it_runs():
    why = registry.get("moe_flashinfer").unavailable("cuda")
    if why:
        pytest.skip(why)
    _bf16_check("moe_flashinfer", _case(33, "skewed", "bfloat16", 256, 128, experts=64), 3)


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("n", [0])
def test_triton_experts_with_no_rows(n):
    x = torch.zeros(n, 64, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4, 32, 64, dtype=torch.bfloat16, device="cuda")
    y = moe_triton.experts(x, torch.zeros(n, 2, dtype=torch.int64, device="cuda"), torch.zeros(n, 2, device="cuda"),
                           w, w.transpose(1, 2).contiguous(), w)
    assert y.shape == (0, 64)


@pytest.mark.gpu
@needs_triton
def test_triton_experts_replay_in_a_cuda_graph_on_new_routing():
    """No host sync: captured once, replayed with other experts written into the same idx tensor."""
    case = _case(9, "uniform", "bfloat16", 256, 128, experts=48)
    a, b = FAM.make_inputs(case, 21), FAM.make_inputs(_case(9, "skewed", "bfloat16", 256, 128, experts=48), 22)
    x, idx, wts, w1, w2, w3 = FAM._on_device(a, "cuda", "bfloat16")
    moe_triton.experts(x, idx, wts, w1, w2, w3)           # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = moe_triton.experts(x, idx, wts, w1, w2, w3)
    idx.copy_(torch.from_numpy(b["idx"]).cuda())
    graph.replay()
    torch.testing.assert_close(y, moe_triton.experts(x, idx, wts, w1, w2, w3), atol=0, rtol=0)
    assert not torch.equal(y, moe_triton.experts(x, torch.from_numpy(a["idx"]).cuda(), wts, w1, w2, w3))


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("seed", range(12))
def test_the_triton_plans_equal_the_torch_plan_bit_for_bit(seed):
    """moe_plan_triton's one-program plan (S <= PLAN_MAX_SLOTS) and chunked plan (any S) against moe_plan.block_plan:
    hot and empty experts, S up to the one-program limit and past it (odd chunk tails), BM 1 / 3 / 16 / 32 / 64,
    every tensor equal, and token = order // k."""
    from kdbench.model import moe_plan_triton as mpt
    rng = np.random.default_rng(seed)
    E, S = int(rng.integers(2, 400)), int(rng.integers(1, mpt.PLAN_MAX_SLOTS + 1))
    if seed == 0:
        E, S = 385, mpt.PLAN_MAX_SLOTS                           # K2's 384 + shared at the slot limit
    if seed == 1:
        E, S = mpt.PLAN_MAX_EXPERTS, mpt.PLAN_MAX_SLOTS          # both limits
    if seed >= 8:                                                # past the one-program limit: the chunked plan only
        E, S = [(385, 4160), (384, 37_441), (mpt.PLAN_MAX_EXPERTS, 9 * mpt.CHUNK), (3, 1025)][seed - 8]
    bm, k = int(rng.choice([1, 3, 16, 32, 64])), int(rng.integers(1, 10))
    flat = torch.from_numpy(_hot_slots(rng, E, S)).cuda()
    want = moe_plan.block_plan(flat, E, bm)
    plans = [mpt.chunked, mpt.block_plan] + ([mpt.one_program] if S <= mpt.PLAN_MAX_SLOTS else [])
    for plan in plans:
        got, token = plan(flat, E, bm, k)
        for name, a, b in zip(want._fields, got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), (plan.__name__, name, seed, E, S, bm)
        assert token.dtype == torch.int32 and torch.equal(token.long(), want.order // k), plan.__name__


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("experts,k,rows,norm", [(384, 8, 1, True), (384, 8, 520, True), (13, 5, 7, True),
                                                 (64, 1, 33, False)])
def test_triton_route_select_picks_the_torch_paths_experts_through_exact_ties(experts, k, rows, norm):
    cfg = dataclasses.replace(get_preset("tiny"), n_routed_experts=experts, n_experts_per_tok=k, n_group=1,
                              topk_group=1, norm_topk_prob=norm)
    g = torch.Generator().manual_seed(rows)
    x, wg = torch.randn(rows, 64, generator=g), torch.randn(experts, 64, generator=g)
    bias = torch.randn(experts, generator=g) * 0.1
    wg[3], wg[5] = wg[1], wg[4]                           # experts 1 = 3 and 4 = 5 score alike on every row
    bias[1] = bias[3] = 5.0                               # 1 and 3 lead every row (scores are < 1): their tie decides
    bias[5] = bias[4]
    x, wg, bias = x.cuda(), wg.cuda(), bias.cuda()
    want_idx, want_w = tmoe.route(x, wg, bias, cfg)
    got_idx, got_w = tmoe.route(x, wg, bias, cfg, triton_select=True)
    assert torch.equal(got_idx, want_idx)
    assert (got_idx[:, 0] == 1).all() and (k == 1 or (got_idx[:, 1] == 3).all()), "ties go to the lower index"
    torch.testing.assert_close(got_w, want_w, rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
@needs_triton
def test_triton_route_select_keeps_nan_rows_in_range():
    """A NaN row (and a half-NaN one) picks live experts below E, never the shared expert's index or past it."""
    s = torch.rand(3, 16, device="cuda")
    s[0], s[1, :8] = float("nan"), float("nan")
    idx, _ = moe_triton.route_select(s, torch.zeros(16, device="cuda"), 4, True, 1.0)
    assert ((idx >= 0) & (idx < 16)).all() and all(len(set(r)) == 4 for r in idx.tolist()), idx
    torch.testing.assert_close(idx[2], torch.sort(s[2], descending=True, stable=True).indices[:4])


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("n_group", [None, 1])   # the preset's groups (the torch selection), one group (Triton's)
def test_routing_ties_through_the_triton_dispatch_match_the_reference_layer(n_group):
    cfg = dataclasses.replace(get_preset("tiny"), hidden=128, moe_intermediate=64, n_routed_experts=16)
    if n_group is not None:
        cfg = dataclasses.replace(cfg, n_group=n_group, topk_group=1)
    wn = ref.init_weights(cfg, 6)
    wn["layers.1.gate"][5] = wn["layers.1.gate"][4]       # identical experts: exact score ties
    wn["layers.1.gate_bias"][5] = wn["layers.1.gate_bias"][4]
    w = tw.from_numpy(wn, "cuda", torch.bfloat16)
    wb = tw.to_numpy(w)                                   # the bf16 values the device reads, as float64
    x = torch.randn(37, cfg.hidden, generator=torch.Generator().manual_seed(6)).to("cuda", torch.bfloat16)
    want = ref_moe.moe_forward(wb, cfg, 1, x.double().cpu().numpy())
    got = tmoe.moe_forward(w, cfg, 1, x, dispatch="triton").double().cpu().numpy()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2

