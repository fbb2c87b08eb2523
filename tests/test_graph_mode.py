"""Graph mode end to end: which steps can be captured (and why not), the e2e kind running both arms in one mode
and recording it, the forward floors (engine/floor.py) and their report cells. CPU: everything but GPU execution
(the graph-mode plumbing of e2e with generate_graphed replaced by an eager stand-in). GPU: the AR graph equals
eager AR token for token, and graph-mode speculative output equals graph-mode AR (batch-invariant targets)."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time

import pytest
import torch

from kdbench import runner
from kdbench.engine import engine as engine_mod
from kdbench.engine import floor
from kdbench.engine import graph as graph_mod
from kdbench.engine.engine import generate, target_from_preset
from kdbench.engine.graph import GraphUnavailable, capture_reason
from kdbench.engine.graph_run import generate_graphed
from kdbench.engine.stages import Policy
from kdbench.kinds import e2e
from kdbench.model.drafter import BlockDrafter
from kdbench.model.moe import route
from kdbench.model.presets import get_preset
from kdbench.model.synthetic import SyntheticDrafter
from kdbench.model.transformer import Transformer
from kdbench.report_tables import forward_cells, generation_rows, graph_mode
from kdbench.results import load_records

GPU_REASON = "needs a CUDA GPU and the kdbench_cuda extension"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason=GPU_REASON)

E2E = """
name: e2e-graph
kind: e2e
seed: 4
cases:
  - name: ddtree
    backends: [torch]
    shape: {model: tiny, policy: ddtree, budget: 8, prompts: 2, prompt_len: 8, max_new_tokens: 10,
            drafter: synthetic, quality: 0.8, batch: 2, forward_floor: true}
"""


@pytest.fixture(scope="module")
def tiny():
    return target_from_preset("tiny", 0, dtype=torch.float32)


# ------------------------------------------------------------------------------------------- capture_reason

@pytest.mark.parametrize("policy,backend,match", [
    (Policy("ar"), "cuda", "CUDA"), (Policy("ar"), "torch", "CUDA"), (Policy("chain", 15), "cuda", "CUDA"),
    (Policy("ddtree", 8), "cuda", "CUDA"), (Policy("ddtree", 8), "torch", "host heap"),
    (Policy("static_kary", branching=(2,)), "cuda", "chain steps only")])
def test_capture_reason_on_the_cpu(tiny, policy, backend, match):
    why = capture_reason(tiny, policy, backend)
    assert why and match in why, why


@pytest.mark.parametrize("dispatch,match", [("loop", "unique"), ("liger", ".item()")])
def test_a_host_syncing_moe_dispatch_is_never_captured(dispatch, match):
    """The registry's host_sync: a target on the loop or Liger dispatch reads the device from the host in every MoE
    layer, so capture is refused before it starts, with the reason, on any machine (the e2e arms then run eagerly)."""
    model = target_from_preset("tiny", 0, dtype=torch.float32)
    model.moe_dispatch = dispatch
    why = capture_reason(model, Policy("ar"), "cuda")
    assert why and dispatch in why and match in why, why
    assert e2e.arms_mode(model, Policy("ddtree", 8), "cuda") == ("eager", f"ar: {why}")


def test_arms_mode_names_the_arm_that_cannot_be_captured(tiny):
    mode, why = e2e.arms_mode(tiny, Policy("ddtree", 8), "cuda")
    assert mode == "eager" and why.startswith("ar: ") and "CUDA" in why      # the AR arm is checked first
    mode, why = e2e.arms_mode(tiny, Policy("ddtree", 8), "torch")
    assert mode == "eager" and "CUDA" in why


def test_generate_graphed_refuses_on_the_cpu(tiny):
    with pytest.raises(GraphUnavailable, match="CUDA"):
        generate_graphed(tiny, None, [[1, 2, 3]], 4, Policy("ar"), backend="torch")


class _FakeGraph:
    """CUDA-graph semantics on the CPU: capture records the step's arguments without running it; replay runs
    it on the same buffers and writes its outputs into static tensors (what a real graph's replay does)."""
    recording: "_FakeGraph | None" = None

    def __init__(self):
        self.args, self.out = None, None

    def register_generator_state(self, gen):
        del gen

    def replay(self):
        tau, size = _REAL_STEP(*self.args)
        self.out[0].copy_(tau)
        self.out[1].copy_(size)


_REAL_STEP = engine_mod.step


def _recording_step(run, st, timer, limit):
    g = _FakeGraph.recording
    if g is None:
        return _REAL_STEP(run, st, timer, limit)
    B = st.bonus.shape[0]
    g.args, g.out = (run, st, timer, limit), (torch.zeros(B, dtype=torch.int32), torch.zeros(B, dtype=torch.int32))
    return g.out


@contextlib.contextmanager
def _fake_capture(g, stream=None):
    del stream
    _FakeGraph.recording = g
    try:
        yield
    finally:
        _FakeGraph.recording = None


class _FakeEvent:
    def __init__(self, **kw):
        self.t = 0.0

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


@pytest.mark.parametrize("policy,temperature", [(Policy("ar"), 0.0), (Policy("ddtree", 8), 0.0),
                                                (Policy("chain", 4), 0.8), (Policy("ddtree", 6), 0.8)])
def test_generate_graphed_rewinds_to_the_prefill(monkeypatch, policy, temperature):
    """generate_graphed with a CPU stand-in for the graph: the warm-up steps are undone (state, drafter context
    and generators put back), so the replays make exactly generate()'s tokens, greedy and sampled."""
    model = Transformer.from_reference(get_preset("tiny"), 0)
    prompts = [[5, 9, 200, 3], [17], [1, 2, 3, 4, 5, 6, 7]]
    oracle = [p + list(range(30, 60)) for p in prompts]
    drafter = (lambda: SyntheticDrafter(oracle, model.cfg.vocab_size, depth=5, quality=0.6, rank_probs=(0.6, 0.4),
                                        seed=3)) if policy.kind != "ar" else (lambda: None)
    want = generate(model, drafter(), prompts, 14, policy, temperature, seed=7)
    monkeypatch.setattr(graph_mod, "_check_capturable", lambda *a: None)
    monkeypatch.setattr(graph_mod, "_warm_up", lambda run, st, limit, stream: [
        _REAL_STEP(run, st, graph_mod._NoTimer(), limit) for _ in range(graph_mod.WARMUP_STEPS)])
    monkeypatch.setattr(engine_mod, "step", _recording_step)
    monkeypatch.setattr(torch.cuda, "Stream", lambda **kw: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", _fake_capture)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    got = generate_graphed(model, drafter(), prompts, 14, policy, temperature, seed=7, backend="torch")
    assert got.graph_mode == "graph" and got.tokens == want.tokens
    assert [s.tau for s in got.steps] == [s.tau for s in want.steps]
    assert all(set(s.stage_ns) == {"step"} for s in got.steps)


# ------------------------------------------------------------------------------------------------ e2e kind

def _run(tmp_path):
    path = tmp_path / "e2e.yaml"
    path.write_text(E2E)
    out = runner.run_scenarios([str(path)], str(tmp_path / "out"), "cpu", progress=False)
    return out, load_records(tmp_path / "out")


def test_e2e_on_the_cpu_records_eager_with_the_reason(tmp_path):
    out, (ar, spec) = _run(tmp_path)
    assert out.exit_code == 0
    for r in (ar, spec):
        assert r.extra["graph_mode"] == "eager" and "CUDA" in r.extra["graph_reason"]
    assert spec.extra["ar_graph_mode"] == "eager"
    assert graph_mode(spec).startswith("eager: ar: ")
    assert ar.extra["forward"]["rows"] == 1 and spec.extra["forward"]["rows"] == 9     # budget 8 + the root
    assert ar.extra["forward"]["mode"] == spec.extra["forward"]["mode"] == "eager"     # no GPU here


def _fake_graphed(calls):
    """An eager stand-in for generate_graphed: the same tokens, each step's stage times folded into "step"."""
    def run(model, drafter, prompts, max_new, policy, temperature, seed, backend):
        calls.append(policy.kind)
        res = generate(model, drafter, prompts, max_new, policy, temperature, seed, backend)
        res.steps = [dataclasses.replace(s, stage_ns={"step": 3 * sum(s.stage_ns.values())}) for s in res.steps]
        res.graph_mode = "graph"
        return res
    return run


def test_e2e_graph_mode_plumbing(tmp_path, monkeypatch):
    """When both arms can be captured, both run graphed: the rows' times, speedup and prediction come from the
    graph runs, graph_mode is recorded for each arm, the eager figures and stage breakdown sit beside them."""
    calls = []
    monkeypatch.setattr(e2e, "arms_mode", lambda model, policy, backend: ("graph", ""))
    monkeypatch.setattr(e2e, "generate_graphed", _fake_graphed(calls))
    out, (ar, spec) = _run(tmp_path)
    assert out.exit_code == 0 and calls == ["ar", "ddtree"]
    assert ar.extra["graph_mode"] == spec.extra["graph_mode"] == spec.extra["ar_graph_mode"] == "graph"
    assert "graph_reason" not in spec.extra and graph_mode(spec) == "graph"
    assert set(spec.extra["stage_s"]) >= {"draft", "build", "verify"}       # the eager breakdown
    assert spec.extra["stage_s_mode"].startswith("eager")
    # the fake graph steps take 3x the eager ones: the rows' times are the graph runs', not the eager ones
    assert spec.time_median_s == pytest.approx(spec.extra["graph_step_s"], rel=0.5)
    assert spec.tokens_per_s < spec.extra["eager_tokens_per_s"]
    assert math.isclose(spec.speedup_vs_ar, spec.tokens_per_s / ar.tokens_per_s)
    assert math.isclose(spec.predicted_speedup, spec.tau * ar.time_median_s / spec.time_median_s)
    assert spec.lossless == "yes" and spec.extra["eager_lossless"] == "yes"


def test_e2e_budget_sweep_shares_one_ar_run_per_mode(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(e2e, "arms_mode", lambda model, policy, backend: ("graph", ""))
    monkeypatch.setattr(e2e, "generate_graphed", _fake_graphed(calls))
    path = tmp_path / "sweep.yaml"
    path.write_text(E2E + "    sweep: {shape.budget: [4, 8]}\n")
    out = runner.run_scenarios([str(path)], str(tmp_path / "sweep"), "cpu", progress=False)
    recs = load_records(tmp_path / "sweep")
    assert out.exit_code == 0 and calls == ["ar", "ddtree", "ddtree"]       # AR graphed once for both budgets
    ars = [r for r in recs if r.policy == "ar"]
    assert len(ars) == 2 and ars[0].samples_s == ars[1].samples_s
    assert ars[0].extra["forward"]["time_s"] == ars[1].extra["forward"]["time_s"]   # one AR floor too
    assert [r.extra["forward"]["rows"] for r in recs if r.policy != "ar"] == [5, 9]


def test_e2e_capture_failure_falls_back_to_eager_for_both_arms(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise GraphUnavailable("no generator registration\nsecond line")
    monkeypatch.setattr(e2e, "arms_mode", lambda model, policy, backend: ("graph", ""))
    monkeypatch.setattr(e2e, "generate_graphed", broken)
    out, (ar, spec) = _run(tmp_path)
    assert out.exit_code == 0
    for r in (ar, spec):
        assert r.extra["graph_mode"] == "eager"
        assert r.extra["graph_reason"] == "graph capture failed: no generator registration"


def test_e2e_floor_failure_keeps_the_row(tmp_path, monkeypatch):
    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB\nmore")
    monkeypatch.setattr(e2e, "forward_floor", oom)
    out, (ar, spec) = _run(tmp_path)
    assert out.exit_code == 0 and spec.lossless == "yes" and spec.tokens_per_s > 0
    assert "forward" not in spec.extra
    assert spec.extra["forward_error"] == "forward floor (9 rows) failed: CUDA out of memory. Tried to allocate 2 GiB"
    assert forward_cells(spec)["fwd_stages"] == spec.extra["forward_error"]


# --------------------------------------------------------------------------------------------------- floors

def _attention_params(cfg) -> int:
    """The MLA weights of one layer from the config alone (independent of the weight dict's names)."""
    H, dc = cfg.n_heads, cfg.kv_lora_rank
    q = cfg.q_lora_rank * cfg.hidden + cfg.q_lora_rank + H * cfg.qk_head_dim * cfg.q_lora_rank
    return (q + cfg.kv_dim * cfg.hidden + dc + H * (cfg.qk_nope_dim + cfg.v_head_dim) * dc
            + cfg.hidden * H * cfg.v_head_dim + cfg.hidden)


def test_forward_floor_formulas(tiny):
    B, T, P = 3, 7, 21
    r = floor.forward_floor(tiny, B, T, P, "eager", reps=2, seed=5)
    cfg, es = tiny.cfg, 4
    st = r["stages"]
    assert set(st) == set(floor.STAGES) and r["mode"] == "eager" and (r["batch"], r["rows"], r["past"]) == (B, T, P)
    R, act = B * T, 2 * B * T * cfg.hidden * es
    kv = B * (P + T) * cfg.kv_dim * es + B * T * cfg.kv_dim * es
    assert st["attention"]["bytes"] == cfg.n_layers * (_attention_params(cfg) * es + kv + act)
    assert st["dense_mlp"]["bytes"] == (3 * cfg.hidden * cfg.intermediate + cfg.hidden) * es + act
    assert st["lm_head"]["bytes"] == (cfg.vocab_size + 1) * cfg.hidden * es + R * cfg.hidden * es + R * cfg.vocab_size * es
    assert st["lm_head"]["flops"] == 2 * R * cfg.vocab_size * cfg.hidden
    assert 1 <= r["experts_touched"][0] <= cfg.n_routed_experts
    per_expert = 3 * cfg.hidden * cfg.moe_intermediate * es
    shared = (3 * cfg.hidden * cfg.moe_intermediate * cfg.n_shared_experts + cfg.n_routed_experts * cfg.hidden
              + cfg.n_routed_experts + cfg.hidden) * es
    assert st["moe"]["bytes"] == shared + r["experts_touched"][0] * per_expert + act
    bw, peak = r["copy_bytes_per_s"], r["bf16_flops_per_s"]
    for v in st.values():
        assert v["mem_floor_s"] == pytest.approx(v["bytes"] / bw)
        assert v["floor_s"] == pytest.approx(max(v["bytes"] / bw, v["flops"] / peak))
    assert r["floor_s"] == pytest.approx(sum(v["floor_s"] for v in st.values()))
    assert r["pct_of_floor"] == pytest.approx(100 * r["floor_s"] / r["time_s"])
    assert st["others"]["time_s"] == pytest.approx(r["time_s"] - sum(st[s]["time_s"] for s in floor.STAGES[:-1]))


def test_forward_floor_counts_the_experts_its_rows_route_to(tiny):
    """The touched-expert count is the routing of the MoE layer's real input: recompute it from the blocks."""
    B, T, P = 2, 5, 9
    r = floor.forward_floor(tiny, B, T, P, "eager", reps=1, seed=11)
    tokens, positions, cache, lens, anc = floor._inputs(tiny, B, T, P, 11)
    fc = tiny.forward_context(tokens, positions, cache, lens, anc, attn="torch")
    h = tiny.ffn_block(0, tiny.attention_block(0, tiny.w["embed"][tokens], fc))
    h = tiny.attention_block(1, h, fc)
    x = tiny.ops.rms_norm(h, tiny.w["layers.1.ffn_norm"], tiny.cfg.rms_eps).reshape(B * T, -1)
    idx, _ = route(x, tiny.w["layers.1.gate"], tiny.w["layers.1.gate_bias"], tiny.cfg)
    assert r["experts_touched"] == [int(torch.unique(idx).numel())]


def test_blocks_compose_to_forward(tiny):
    """forward() is the blocks in order (what the floor times one by one)."""
    tokens, positions, cache, lens, anc = floor._inputs(tiny, 2, 4, 6, 3)
    want = tiny.forward(tokens, positions, cache, lens, anc, tap_layers=()).logits
    fc = tiny.forward_context(tokens, positions, cache, lens, anc)
    h = tiny.w["embed"][tokens]
    for i in range(tiny.cfg.n_layers):
        h = tiny.ffn_block(i, tiny.attention_block(i, h, fc))
    assert torch.equal(tiny.head(h), want)


def test_forward_floor_bad_arguments(tiny):
    with pytest.raises(ValueError, match="mode"):
        floor.forward_floor(tiny, 1, 1, 4, "fast")
    with pytest.raises(GraphUnavailable, match="CUDA"):
        floor.forward_floor(tiny, 1, 1, 4, "graph")
    with pytest.raises(ValueError, match=">= 1"):
        floor.forward_floor(tiny, 1, 0, 4, "eager")


def test_report_cells(tmp_path):
    _, (ar, spec) = _run(tmp_path)
    rows = generation_rows([ar, spec])
    assert rows[1]["graph_mode"].startswith("eager: ")
    cells = forward_cells(spec)
    assert cells["fwd_s"] == spec.extra["forward"]["time_s"] and cells["fwd_pct"] > 0
    assert cells["fwd_stages"].startswith("eager, 2x9 rows over 8 keys: attn ")
    assert "moe" in cells["fwd_stages"] and "lm_head" in cells["fwd_stages"]
    assert forward_cells(dataclasses.replace(spec, extra={}))["fwd_s"] is None
    # a stage whose graph time came out <= 0 has no % (the H200 run's "others" = whole - stage graphs < 0)
    fwd = copy.deepcopy(spec.extra["forward"])
    fwd["stages"]["moe"]["pct_of_floor"] = None
    assert "moe" in forward_cells(dataclasses.replace(spec, extra={"forward": fwd}))["fwd_stages"]
    assert "at n/a of floor" in forward_cells(dataclasses.replace(spec, extra={"forward": fwd}))["fwd_stages"]


# ------------------------------------------------------------------------------------------- GPU (H200)

def _reduced_kimi(top_k: int):
    return dataclasses.replace(get_preset("kimi-k2"), name=f"kimi-k2-reduced-top{top_k}", n_layers=2, hidden=1024,
                               n_heads=8, q_lora_rank=256, intermediate=2048, moe_intermediate=256,
                               n_routed_experts=16, n_experts_per_tok=top_k, vocab_size=4096, max_seq_len=4096)


PROMPTS = [[7, 3, 99, 1024, 5], list(range(100, 117)), [42, 43], list(range(2000, 2040))]


@pytest.fixture(scope="module")
def gpu_ok():
    from kdbench.backends import cuda_build
    reason = cuda_build.unavailable_reason()
    if reason:
        pytest.skip(f"{GPU_REASON}: {reason}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("policy", [Policy("ar"), Policy("chain", 15)])
def test_graph_equals_eager_token_for_token(gpu_ok, policy):
    """Top-1 routing (an order-free MoE combine): replays commit exactly eager generate()'s tokens."""
    model = Transformer.random(_reduced_kimi(1), 0, device="cuda", dtype=torch.bfloat16)
    drafter = BlockDrafter.random(model, seed=1) if policy.kind != "ar" else None
    want = generate(model, drafter, PROMPTS, 40, policy, backend="cuda")
    got = generate_graphed(model, drafter, PROMPTS, 40, policy, backend="cuda")
    assert got.graph_mode == "graph" and got.tokens == want.tokens
    if policy.kind == "ar":   # (a chain's drafter scans the whole cache in a graph: its drafts may differ by a bit)
        assert len(got.steps) == len(want.steps) == 39
    assert all(s.stage_ns["step"] > 0 for s in got.steps)


def _lossless_in_graph_mode(model, drafter, prompts, n_new):
    ar = generate_graphed(model, None, prompts, n_new, Policy("ar"), backend="cuda")
    eager_ar = generate(model, None, prompts, n_new, Policy("ar"), backend="cuda")
    assert ar.tokens == eager_ar.tokens, "AR graph vs eager AR"
    for policy in (Policy("ddtree", 32), Policy("chain", 15)):
        spec = generate_graphed(model, drafter, prompts, n_new, policy, backend="cuda")
        assert spec.tokens == ar.tokens, f"{policy.label} in graph mode differs from AR"
        assert spec.mean_tau >= 1


@pytest.mark.gpu
@needs_gpu
def test_speculative_graph_equals_ar_batch_invariant(gpu_ok):
    """A batch-invariant target (plans/0010): AR and verify compute every row alike, so graph-mode speculative
    output must equal graph-mode AR bit for bit (K2's top-8 routing)."""
    model = Transformer.random(_reduced_kimi(8), 0, device="cuda", dtype=torch.bfloat16, batch_invariant=True)
    _lossless_in_graph_mode(model, BlockDrafter.random(model, seed=1), PROMPTS, 48)


@pytest.mark.gpu
@needs_gpu
def test_trained_pair_graph_mode_is_lossless(gpu_ok):
    """The shipped pair, batch-invariant, on held-out prompts: deep acceptances, still AR's tokens exactly."""
    from kdbench import pair
    from kdbench.prompts import token_prompts
    model = pair.load_target("cuda", torch.bfloat16, batch_invariant=True)
    prompts = token_prompts("code", 2, 64) + token_prompts("prose", 2, 64)
    _lossless_in_graph_mode(model, pair.load_drafter(model), prompts, 48)


@pytest.mark.gpu
@needs_gpu
def test_forward_floor_graph_is_sane(gpu_ok):
    model = Transformer.random(_reduced_kimi(8), 0, device="cuda", dtype=torch.bfloat16)
    r = floor.forward_floor(model, 8, 65, 256, "graph", reps=5)
    assert r["mode"] == "graph" and r["attention"] == "cuda" and r["time_s"] > 0
    assert 0 < r["pct_of_floor"] <= 100, r["pct_of_floor"]
    blocks = sum(r["stages"][s]["time_s"] for s in floor.STAGES[:-1])
    assert blocks == pytest.approx(r["time_s"], rel=0.5), (blocks, r["time_s"])
