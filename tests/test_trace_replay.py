"""Replay equals live: for every tree policy, the tau of each round replayed from a recorded trace equals the
tau of the same round of a live greedy generate() (tiny float64 target, ragged prompts, the keyed synthetic
drafter and the block drafter). Plus the trace's KDTR and JSONL round trips and the adaptive cut."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from kdbench import config, costfit
from kdbench import replay as rp
from kdbench import trace as tr
from kdbench.backends.adaptive import best_size
from kdbench.engine.engine import generate
from kdbench.engine.stages import Policy
from kdbench.errors import ScenarioError
from kdbench.model.drafter import BlockDrafter
from kdbench.model.keyed import KeyedSyntheticDrafter
from kdbench.model.presets import get_preset
from kdbench.model.transformer import Transformer

N_PROMPTS, MAX_NEW, K, SEED = 7, 20, 64, 3
POLICIES = [Policy("chain", 15), Policy("chain", 4), Policy("ddtree", 1), Policy("ddtree", 8), Policy("ddtree", 64),
            Policy("ddtree_width_capped", 32, max_width=2), Policy("static_kary", branching=(4, 2, 1)),
            Policy("adaptive", 64, row_cost=0.02), Policy("adaptive", 48, row_cost=0.2)]


@pytest.fixture(scope="module")
def world():
    model = Transformer.from_reference(get_preset("tiny"), SEED)
    rng = np.random.default_rng(SEED)
    prompts = [rng.integers(0, model.cfg.vocab_size - 1, int(n)).tolist() for n in rng.integers(1, 14, N_PROMPTS)]
    ar = generate(model, None, prompts, MAX_NEW + 16, Policy("ar"))
    oracle = [p + t for p, t in zip(prompts, ar.tokens)]

    def keyed(first, last):
        return KeyedSyntheticDrafter(oracle[first:last], model.cfg.vocab_size, depth=15, quality=0.6,
                                     rank_probs=(0.5, 0.25, 0.13, 0.07, 0.05), seed=11, keys=range(first, last))
    block = BlockDrafter.random(model, seed=5)
    drafters = {"keyed": keyed, "block": lambda first, last: block}
    # batches of 3 when recording, one batch of 7 live: replay must not depend on batch composition
    traces = {n: tr.record(model, prompts, MAX_NEW - 1, K, d, batch=3, categories=["a", "b"] * 3 + ["a"])
              for n, d in drafters.items()}
    return dict(model=model, prompts=prompts, ar=ar.tokens, drafters=drafters, traces=traces)


def test_trace_holds_the_greedy_continuation(world):
    t = world["traces"]["keyed"]
    assert t.top_lp.shape == (N_PROMPTS, MAX_NEW - 1, 15, K) and t.top_lp.dtype == np.float32
    assert t.continuation.tolist() == [a[:MAX_NEW + 15] for a in world["ar"]]
    assert t.meta["model"] == "tiny" and len(t.meta["weights_sha256"]) == 64 and t.meta["k"] == K
    assert np.all(np.diff(t.top_lp, axis=-1) <= 0), "ranks are sorted by log-prob"


@pytest.mark.parametrize("drafter", ["keyed", "block"])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.label)
def test_replay_equals_live_round_by_round(world, drafter, policy):
    make = world["drafters"][drafter]
    live = generate(world["model"], make(0, N_PROMPTS), world["prompts"], MAX_NEW, policy)
    assert live.tokens == [a[:MAX_NEW] for a in world["ar"]]
    got = rp.replay(world["traces"][drafter], policy, MAX_NEW)
    want = rp.live_taus(live)
    for b, (g, w) in enumerate(zip(got.prompts, want)):
        assert list(g.tau) == w, f"{drafter} {policy.label}: prompt {b} replay {g.tau} != live {w}"
        sizes = [s.tree_size[b] for s in live.steps if s.tau[b] > 0]
        assert list(g.nodes) == sizes, f"tree rows differ for prompt {b}"
    assert got.mean_tau == pytest.approx(live.mean_tau, abs=1e-12)


def test_the_keyed_synthetic_trace_has_deep_accepts(world):
    """Otherwise equality would be trivial: the keyed drafter must get several drafts accepted."""
    r = rp.replay(world["traces"]["keyed"], Policy("ddtree", 64))
    assert max(t for p in r.prompts for t in p.tau) >= 5 and r.mean_tau > 2.0
    assert set(r.per_category()) == {"a", "b"} and len(r.per_prompt()) == N_PROMPTS


def test_a_changed_draft_changes_the_replay(world):
    """The comparison can fail: moving the true token out of one round's chain changes that round."""
    t = world["traces"]["keyed"]
    base = rp.replay(t, Policy("chain", 15))
    p, j = next((p, j) for p, pr in enumerate(base.prompts) for j, tau in zip(pr.starts, pr.tau) if tau >= 3)
    tok = t.top_tok.copy()
    tok[p, j, 0, 0] = (tok[p, j, 0, 0] + 1) % 256   # the depth-1 draft is now wrong
    bad = rp.replay(tr.Trace(t.prompts, t.categories, t.continuation, t.top_lp, tok, t.meta), Policy("chain", 15))
    assert bad.prompts[p].tau[bad.prompts[p].starts.index(j)] == 1


def test_kdtr_round_trip(world, tmp_path):
    t = world["traces"]["block"]
    tr.save(tmp_path / "t.kdtr", t)
    u = tr.load(tmp_path / "t.kdtr")
    assert u.prompts == t.prompts and u.categories == t.categories and u.meta == t.meta
    for name in ("continuation", "top_lp", "top_tok"):
        np.testing.assert_array_equal(getattr(u, name), getattr(t, name))
    assert rp.replay(u, Policy("ddtree", 32)) == rp.replay(t, Policy("ddtree", 32))


def test_jsonl_converter(world, tmp_path):
    t = world["traces"]["keyed"]
    path = tmp_path / "t.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"meta": {"model": "other-engine"}}) + "\n")
        for p in range(t.n_prompts):
            rounds = [{"tokens": t.top_tok[p, j].tolist(), "logprobs": t.top_lp[p, j].tolist()}
                      for j in range(t.rounds)]
            f.write(json.dumps({"prompt": list(t.prompts[p]), "category": t.categories[p],
                                "continuation": t.continuation[p].tolist(), "rounds": rounds}) + "\n")
    u = tr.from_jsonl(path)
    assert u.meta["model"] == "other-engine"
    for pol in (Policy("ddtree", 64), Policy("static_kary", branching=(3, 2))):
        assert rp.replay(u, pol).prompts == rp.replay(t, pol).prompts
    path.write_text(json.dumps({"prompt": [1], "continuation": [1, 2]}) + "\n")
    with pytest.raises(ValueError, match="line 1: missing key 'rounds'"):
        tr.from_jsonl(path)


def test_replay_refuses_what_the_trace_cannot_answer(world):
    t = world["traces"]["keyed"]
    with pytest.raises(ValueError, match="needs top-128"):
        rp.replay(t, Policy("ddtree", 128))
    with pytest.raises(ValueError, match="max_new_tokens must be in 2..20"):
        rp.replay(t, Policy("ddtree", 8), 21)
    with pytest.raises(ValueError, match="no tree"):
        rp.replay(t, Policy("ar"))


def test_keyed_drafter_is_a_function_of_the_position():
    d = KeyedSyntheticDrafter([list(range(40))] * 3, 256, depth=5, quality=0.7, rank_probs=(0.6, 0.4), seed=2)
    d.reset(3, 64)
    bonus = torch.zeros(3, dtype=torch.int64)
    a = d.draft(bonus, torch.tensor([4, 9, 4]), 64)
    d.draft(bonus, torch.tensor([1, 2, 3]), 64)          # an unrelated call in between changes nothing
    b = d.draft(bonus, torch.tensor([4, 9, 4]), 64)
    assert torch.equal(a, b)
    assert not torch.equal(a[0], a[2]), "requests have their own keys"
    assert not torch.equal(a[0], d.draft(bonus, torch.tensor([5, 9, 4]), 64)[0])
    assert d.name.startswith("synthetic-keyed(")


def test_adaptive_best_size_is_the_brute_force_argmax():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, c = int(rng.integers(0, 40)), float(rng.choice([0.0, rng.exponential(0.1), 5.0]))
        scores = np.concatenate(([0.0], -np.sort(rng.exponential(2.0, n))))   # pop order: non-increasing
        ratios = [(1 + sum(np.exp(scores[1:m + 1]))) / (1 + c * m) for m in range(n + 1)]
        assert best_size(scores, c) == int(np.argmax(ratios))
    assert best_size(np.array([0.0, -0.1, -0.2]), 0.0) == 2
    assert best_size(np.array([0.0, -0.1, -0.2]), 100.0) == 0
    with pytest.raises(ValueError, match="row_cost"):
        Policy("adaptive", 8, row_cost=-1.0)


PAIR_POLICIES = [Policy("chain", 15), Policy("ddtree", 16), Policy("ddtree", 64),
                 Policy("ddtree_width_capped", 32, max_width=2), Policy("static_kary", branching=(4, 2, 1)),
                 Policy("adaptive", 64, row_cost=0.01), Policy("adaptive", 48, row_cost=0.3)]


@pytest.fixture(scope="module")
def pair_world():
    """The shipped trained pair in float64 (no near-tie can differ between the trace's AR decode and the live
    tree verify), on one held-out prompt of each text category, recorded in batches of 2."""
    from kdbench.kinds.replay import load_pair
    from kdbench.prompts import token_prompts
    model, drafter = load_pair("cpu", torch.float64)
    cats = ("code", "prose", "structured")
    prompts = [p for c in cats for p in token_prompts(c, 1, 24)]
    t = tr.record(model, prompts, 11, 64, lambda first, last: drafter, batch=2, categories=list(cats))
    return dict(model=model, drafter=drafter, prompts=prompts, trace=t)


@pytest.mark.parametrize("policy", PAIR_POLICIES, ids=lambda p: p.label)
def test_replay_equals_live_on_the_trained_pair(pair_world, policy):
    """Issue 13 item 2 on the trained pair (plans/0007): its own drafter, held-out text prompts, every policy
    kind; tau and tree rows equal round by round, and the live tokens are the target's greedy ones."""
    w = pair_world
    live = generate(w["model"], w["drafter"], w["prompts"], 12, policy)
    assert live.tokens == [list(c[:12]) for c in w["trace"].continuation]
    got = rp.replay(w["trace"], policy)
    assert rp.live_taus(live) == [list(p.tau) for p in got.prompts], policy.label
    for b, g in enumerate(got.prompts):
        assert list(g.nodes) == [s.tree_size[b] for s in live.steps if s.tau[b] > 0], f"tree rows, prompt {b}"


def test_the_trained_pair_trace_is_a_real_drafter(pair_world):
    """Not trivial: the trained drafter gets drafts accepted on text (tau well above 1), and a tree beats
    the chain of the same drafter on the same prompts."""
    t = pair_world["trace"]
    assert t.meta["model"] == "kdbench-pair" and t.meta["drafter"].startswith("trained(")
    tree, chain = rp.replay(t, Policy("ddtree", 64)), rp.replay(t, Policy("chain", 15))
    assert max(x for p in tree.prompts for x in p.tau) >= 4 and tree.mean_tau > 1.8
    assert tree.mean_tau > chain.mean_tau
    assert set(tree.per_category()) == {"code", "prose", "structured"}


def test_replay_kind_runs_the_committed_scenario(tmp_path):
    """scenarios/replay_tiny.yaml: every policy passes the live check; modeled fields are labelled."""
    from pathlib import Path

    from kdbench import runner
    from kdbench.results import load_records
    path = Path(__file__).parents[1] / "scenarios" / "replay_tiny.yaml"
    out = runner.run_scenarios([str(path)], str(tmp_path / "run"), "cpu", progress=False)
    recs = load_records(tmp_path / "run")
    assert out.exit_code == 0, [(r.case, r.reason) for r in recs]
    live = [r for r in recs if r.case.startswith("policies")]
    assert len(live) == 5 and all(r.status == "pass" for r in live)
    assert {r.policy.split("(")[0] for r in live} == {"chain", "ddtree", "ddtree_width_capped", "static_kary",
                                                       "adaptive"}
    budgets = sorted((r for r in recs if r.case.startswith("budgets")), key=lambda r: r.tau)
    assert [r.policy for r in budgets] == ["ddtree(B=4)", "ddtree(B=16)", "ddtree(B=64)"]
    assert all(r.family == "" for r in recs)      # family is a kernel family only (issue 10)
    assert all(r.extra["modeled"] and r.extra["modeled_speedup"] > 0 and r.extra["experts_per_layer"] > 0
               and r.extra["modeled_tokens_per_s"] > 0 for r in recs)
    fit = costfit.shipped()
    assert all(r.extra["cost_fit"] == f"fit: {fit.label()}" and "NVIDIA H200" in r.extra["cost_fit"] for r in recs)
    assert all(r.extra["modeled_verify_s"] + r.extra["modeled_outside_verify_s"] == pytest.approx(
        r.extra["modeled_step_s"]) for r in recs)
    # modeled numbers never sit in the measured columns of results.csv
    assert all(math.isnan(r.tokens_per_s) and math.isnan(r.predicted_speedup) for r in recs)


@pytest.mark.parametrize("shape,message", [
    ("{k: 16, budget: 64}", "expected >= budget 64"),
    ("{policy: static_kary, branching: [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]}", "deeper than the drafter"),
    ("{rounds: 5000}", "exceeds tiny's max_seq_len"),
    ("{cost_model: nope}", "expected a model preset"),
    ("{row_cost: .inf}", "row_cost"),
    ("{drafter: pair}", "expected kdbench-pair"),
    ("{drafter: keyed, category: code}", "text prompt sets need drafter pair"),
    ("{model: kdbench-pair, drafter: pair, category: prose, prompts: 40}", "at most 32 prompts"),
])
def test_replay_shape_rejects_bad_input(tmp_path, shape, message):
    from kdbench import config
    from kdbench.errors import ScenarioError
    path = tmp_path / "bad.yaml"
    path.write_text(f"name: bad\nkind: replay\ncases:\n  - name: c\n    shape: {shape}\n")
    with pytest.raises(ScenarioError, match=message):
        config.load(path)


def test_a_replay_case_naming_cuda_is_refused(tmp_path):
    """Replay runs the policy on the host and its live check on torch: a cuda backend would be recorded as torch."""
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nkind: replay\ncases:\n  - name: c\n    backends: [cuda]\n    shape: {}\n")
    with pytest.raises(ScenarioError, match=r"cases\[0\]\.backends\[0\].*expected one of torch$"):
        config.load(path)


@pytest.mark.parametrize("shape", ["{check_live: true, drafter: synthetic-only}", "{check_live: true, trace: t.kdtr}"])
def test_a_live_check_without_a_target_is_refused(tmp_path, shape):
    """The kind runs the live check only when it has a target: asked for without one it passed as 'info'."""
    path = tmp_path / "r.yaml"
    path.write_text(f"name: r\nkind: replay\ncases:\n  - name: c\n    shape: {shape}\n")
    with pytest.raises(ScenarioError, match=r"cases\[0\]\.shape\.check_live.*no target to run live"):
        config.load(path)
