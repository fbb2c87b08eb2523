"""CUDA-graph capture of one speculative step (suite/engine/graph.py): replays commit exactly the tokens, KV rows
and drafter context of eager steps from the same state; the bucket bound; eager-vs-graph timing. On a CPU-only
machine capture_step and the timing refuse with a clear error (checked here too)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from kdbench.engine.engine import Request, generate, greedy_oracle, prepare
from kdbench.engine.graph import GraphUnavailable, StepGraph, capture_step, time_step_eager_vs_graph
from kdbench.engine.stages import Policy
from kdbench.model.drafter import BlockDrafter
from kdbench.model.presets import get_preset
from kdbench.model.synthetic import SyntheticDrafter
from kdbench.model.transformer import Transformer

GPU_REASON = "needs a CUDA GPU and the kdbench_cuda extension"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason=GPU_REASON)


# ------------------------------------------------------------------------------------------- any machine

@pytest.fixture(scope="module")
def cpu_world():
    model = Transformer.random(get_preset("tiny"), 0, dtype=torch.float32)
    return model, BlockDrafter.random(model, seed=1, block_size=5), [[1, 2, 3], [4, 5]]


@pytest.mark.parametrize("policy,backend,match", [
    (Policy("ddtree", 8), "torch", "host heap"),
    (Policy("chain", 8), "torch", "host heap"),
    (Policy("static_kary", branching=(2, 2)), "cuda", "AR, DDTree and chain steps only"),
    (Policy("ddtree_width_capped", 8, max_width=2), "cuda", "AR, DDTree and chain steps only"),
])
def test_host_heap_paths_are_refused(cpu_world, policy, backend, match):
    """These build trees on the host on every machine, so the refusal comes before any device check."""
    model, drafter, prompts = cpu_world
    with pytest.raises(ValueError, match=match):
        capture_step(model, drafter, prompts, policy, backend=backend)


@pytest.mark.parametrize("policy,backend", [(Policy("ar"), "cuda"), (Policy("ar"), "torch"),
                                            (Policy("chain", 15), "cuda"), (Policy("ddtree", 8), "cuda")])
def test_capturable_steps_need_only_a_gpu(cpu_world, policy, backend):
    """AR (any backend: no tree), chain (built on the device) and DDTree on cuda pass the argument checks;
    on this CPU-only machine they stop at the device check, with the reason."""
    model, drafter, prompts = cpu_world
    with pytest.raises(GraphUnavailable, match="CUDA"):
        capture_step(model, drafter if policy.kind != "ar" else None, prompts, policy, backend=backend)


@pytest.mark.parametrize("kw,match", [({"max_new_tokens": 0}, "max_new_tokens"), ({"steps": 0}, "steps"),
                                      ({"max_new_tokens": 2.5}, "max_new_tokens")])
def test_bad_arguments(cpu_world, kw, match):
    model, drafter, prompts = cpu_world
    with pytest.raises(ValueError, match=match):
        capture_step(model, drafter, prompts, Policy("ddtree", 8), **kw)


def test_cpu_model_is_a_clear_error(cpu_world):
    """No CUDA (this machine) or a model on the CPU: GraphUnavailable naming CUDA, not a crash."""
    model, drafter, prompts = cpu_world
    assert issubclass(GraphUnavailable, RuntimeError)
    with pytest.raises(GraphUnavailable, match="CUDA"):
        capture_step(model, drafter, prompts, Policy("ddtree", 8))
    with pytest.raises(GraphUnavailable, match="CUDA"):
        time_step_eager_vs_graph(model, drafter, prompts, Policy("ddtree", 8), n_steps=2)
    with pytest.raises(ValueError, match="n_steps"):
        time_step_eager_vs_graph(model, drafter, prompts, Policy("ddtree", 8), n_steps=0)


def _eager_graph(world, temperature: float):
    """A StepGraph without a graph (CPU, torch backend): the same step wrapper, buffers and snapshots."""
    model, prompts, oracle = world
    drafter = SyntheticDrafter(oracle, model.cfg.vocab_size, quality=0.6, rank_probs=(0.6, 0.4), seed=3)
    run, st = prepare(Request(model, drafter, prompts, 12, Policy("ddtree", 8), temperature, 7, "torch"))
    gens = (drafter.gen, run.sampler.gen)
    return StepGraph(run, st, run.max_len, graph=None, tau=None, tree_size=None, steps_left=None, generators=gens)


@pytest.fixture(scope="module")
def f64_world():
    model = Transformer.from_reference(get_preset("tiny"), 0)
    prompts = [[5, 9, 200, 3], [17], [1, 2, 3, 4, 5, 6, 7]]
    return model, prompts, greedy_oracle(model, prompts, 24)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_eager_steps_keep_buffers_and_match_generate(f64_world, temperature):
    """The wrapper keeps every rewritten tensor at its address (what a graph replays against), and its steps
    are generate()'s: same tokens, greedy and sampled (same seeds, same random draws)."""
    sg = _eager_graph(f64_world, temperature)
    ptrs = {k: v.data_ptr() for k, v in sg.tensors().items()}
    while not bool(sg.state.done.all()):
        sg.eager_step()
        assert {k: v.data_ptr() for k, v in sg.tensors().items()} == ptrs
    model, prompts, oracle = f64_world
    drafter = SyntheticDrafter(oracle, model.cfg.vocab_size, quality=0.6, rank_probs=(0.6, 0.4), seed=3)
    want = generate(model, drafter, prompts, 12, Policy("ddtree", 8), temperature, seed=7)
    assert sg.tokens() == want.tokens


def test_restore_replays_the_same_steps(f64_world):
    """snapshot() / restore() bring back the tensors and the generators: the next steps repeat exactly."""
    sg = _eager_graph(f64_world, 0.8)
    sg.eager_step()
    snap = sg.snapshot()
    runs = []
    for _ in range(2):
        sg.restore(snap)
        assert all(torch.equal(v, snap["tensors"][k]) for k, v in sg.tensors().items())
        taus = [sg.eager_step()[0].tolist() for _ in range(3)]
        runs.append((taus, {k: v.clone() for k, v in sg.tensors().items()}))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])
    assert not torch.equal(runs[0][1]["n_gen"], snap["tensors"]["n_gen"]), "the steps advanced the state"


# ------------------------------------------------------------------------------------------- GPU (H200)

PROMPTS = [[7, 3, 99, 1024, 5], list(range(100, 117)), [42, 43], list(range(2000, 2040))]  # batch 4, ragged
MAX_NEW, N_STEPS = 96, 6


def _reduced_kimi(top_k: int):
    """kimi-k2's attention widths (dc 512, dr 64, nope 128, v 128: the CUDA kernel's shape, YaRN as K2), two
    layers (dense, MoE), narrow elsewhere. top_k 1 makes the MoE combine (index_add_ atomics) order-free, so
    eager steps are bit-reproducible; top_k 8 is K2's routing (used for timing)."""
    return dataclasses.replace(get_preset("kimi-k2"), name=f"kimi-k2-reduced-top{top_k}", n_layers=2, hidden=1024,
                               n_heads=8, q_lora_rank=256, intermediate=2048, moe_intermediate=256,
                               n_routed_experts=16, n_experts_per_tok=top_k, vocab_size=4096, max_seq_len=4096)


@pytest.fixture(scope="module")
def gpu_world():
    from kdbench.backends import cuda_build
    reason = cuda_build.unavailable_reason()
    if reason:
        pytest.skip(f"{GPU_REASON}: {reason}")
    model = Transformer.random(_reduced_kimi(1), 0, device="cuda", dtype=torch.bfloat16)
    oracle = greedy_oracle(model, PROMPTS, MAX_NEW + 32, backend="cuda")
    return dict(model=model, oracle=oracle)


def _drafter(world, kind: str):
    if kind == "block":
        return BlockDrafter.random(world["model"], seed=1)  # L = 15
    return SyntheticDrafter(world["oracle"], world["model"].cfg.vocab_size, quality=0.7,
                            rank_probs=(0.6, 0.3, 0.1), seed=2, device="cuda")


def _committed(sg) -> dict:
    """Host copies of what the steps committed: counters, per-request tokens, KV rows, drafter context rows."""
    st, out = sg.state, {}
    for name in ("n_gen", "done", "bonus"):
        out[name] = getattr(st, name).cpu()
    out["lengths"] = st.cache.lengths.cpu()
    for b in range(len(PROMPTS)):
        n, rows = int(out["n_gen"][b]), int(out["lengths"][b])
        out[f"tokens[{b}]"] = st.gen[b, :n].cpu()
        out[f"kv[{b}]"] = st.cache.kv[:, b, :rows].cpu()
        if hasattr(sg.run.drafter, "ctx_len"):
            c = int(sg.run.drafter.ctx_len[b])
            out[f"ctx_k[{b}]"] = sg.run.drafter.ctx_k[:, b, :c].cpu()
            out[f"ctx_v[{b}]"] = sg.run.drafter.ctx_v[:, b, :c].cpu()
    return out


def _eager_steps_strict(sg, n: int) -> None:
    """n eager steps, any host synchronization inside them an error."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(n):
            sg.eager_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kind,budget,temperature", [("block", 16, 0.0), ("block", 64, 0.0), ("synthetic", 16, 0.0),
                                                     ("synthetic", 64, 0.0), ("block", 16, 0.8)])
def test_replay_equals_eager_steps(gpu_world, kind, budget, temperature):
    policy, drafter = Policy("ddtree", budget), _drafter(gpu_world, kind)
    args = (gpu_world["model"], drafter, PROMPTS, policy)
    kw = dict(max_new_tokens=MAX_NEW, temperature=temperature, seed=5)
    if (kind == "synthetic" or temperature > 0) and not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
        with pytest.raises(GraphUnavailable, match="register"):
            capture_step(*args, **kw)
        return
    sg = capture_step(*args, **kw)
    start = sg.snapshot()
    before = start["tensors"]["n_gen"].cpu()
    for _ in range(N_STEPS):
        sg.replay()
    torch.cuda.synchronize()
    graphed = _committed(sg)
    sg.restore(start)
    _eager_steps_strict(sg, N_STEPS)
    eager = _committed(sg)
    grown = graphed["n_gen"] - before  # nobody is done after the warm-up (MAX_NEW 96 > 4 steps x 16 tokens)
    assert (grown >= N_STEPS).all(), f"every replay commits at least the bonus token, grew {grown.tolist()}"
    if kind == "synthetic":
        assert int(grown.max()) > N_STEPS, "deep acceptances (multi-row compaction) exercised"
    assert graphed.keys() == eager.keys()
    for name, want in eager.items():
        assert torch.equal(graphed[name], want), f"{kind} B={budget} T={temperature}: {name} differs graph vs eager"


@pytest.mark.gpu
@needs_gpu
def test_bucket_bound_holds_then_refuses(gpu_world):
    """A bucket for `steps` steps: at least that many fit, every replay stays inside it, then replay refuses."""
    model = gpu_world["model"]
    sg = capture_step(model, BlockDrafter.random(model, seed=1), PROMPTS, Policy("ddtree", 16),
                      max_new_tokens=MAX_NEW, steps=2)
    assert sg.kv_limit % 64 == 0 and sg.kv_limit < sg.run.max_len, sg.kv_limit
    assert sg.steps_left >= 2
    while sg.steps_left:
        assert int(sg.state.cache.lengths.max()) + sg.run.rows <= sg.kv_limit, "the step about to run fits"
        sg.replay()
    with pytest.raises(RuntimeError, match="used up"):
        sg.replay()


@pytest.mark.gpu
@needs_gpu
def test_time_step_eager_vs_graph_is_sane(gpu_world):
    """K2 routing (top-8), B = 64, batch 4: the graph step is faster than the eager one (one launch instead of
    hundreds); the verify forward is part of the eager step; the formulas hold."""
    model = Transformer.random(_reduced_kimi(8), 0, device="cuda", dtype=torch.bfloat16)
    n = 10
    r = time_step_eager_vs_graph(model, BlockDrafter.random(model, seed=1), PROMPTS, Policy("ddtree", 64), n)
    print({k: (np.median(v) if isinstance(v, list) else v) for k, v in r.items()})  # the record, with -s
    assert len(r["eager_step_s"]) == len(r["graph_step_s"]) == len(r["verify_s"]) == n
    assert min(r["eager_step_s"] + r["graph_step_s"] + r["verify_s"]) > 0
    eager, graph, verify = (float(np.median(r[k])) for k in ("eager_step_s", "graph_step_s", "verify_s"))
    assert graph < eager, f"graph step {graph * 1e3:.3f} ms is not faster than eager {eager * 1e3:.3f} ms"
    assert 0 < r["verify_share"] < 1
    assert r["verify_share"] == pytest.approx(verify / eager)
    assert r["outside_verify_s"] == pytest.approx(eager - verify) and r["outside_verify_s"] > 0
    assert r["graph_outside_verify_s"] == pytest.approx(graph - verify)
    assert r["batch"] == 4 and r["rows"] == 65
