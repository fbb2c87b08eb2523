"""The backend registry: every entry resolves to real functions for the families it serves, every family
module implements the KernelFamily contract, and adding a backend is one entry + a module: a planted entry
is accepted by the scenario loader, dispatched by the kernel kind, checked, timed in ABBA rounds, and a
backend that skips work on repeated calls fails the check of its timed outputs."""
from __future__ import annotations

import inspect
import sys
import types

import pytest

from kdbench import config, families, kinds, shapes, timing
from kdbench.backends import registry, torch_ops
from kdbench.families import KernelFamily
from kdbench.regress import gates
from kdbench.results import POLICY_KINDS

OPS = {"tree_build": ("tree_build",), "tree_accept": ("tree_accept_greedy", "tree_accept_sampled"),
       "kv_compact": ("kv_compact",), "tree_verify_mla": ("tree_verify_mla",), "moe_experts": ("moe_experts",)}


@pytest.mark.parametrize("entry", registry.ENTRIES, ids=lambda e: e.name)
def test_every_entry_resolves_its_ops(entry):
    if entry.name == "numpy_ref":
        assert entry.role == "reference"
        return
    if entry.name == "cpu_heap" and entry.why_unavailable():
        pytest.skip(entry.why_unavailable())
    for family in entry.families:
        for op in OPS[family]:
            assert callable(entry.op(op)), (entry.name, op)


@pytest.mark.parametrize("family", families.FAMILIES)
def test_family_modules_implement_the_protocol(family):
    module = families.get(family)
    for name, proto in inspect.getmembers(KernelFamily, inspect.isfunction):
        if name.startswith("_"):
            continue
        fn = getattr(module, name, None)
        assert callable(fn), f"{family}.{name} missing"
        want = [p for p in inspect.signature(proto).parameters if p != "self"]
        assert list(inspect.signature(fn).parameters) == want, f"{family}.{name}"


def test_roles_and_gating():
    assert registry.names("ours") == ("cuda", "cuda_mma", "cuda_pingpong", "moe_triton")
    assert set(registry.names("peer")) == {"flashinfer_cascade", "flashinfer_prefix", "flashinfer_causal",
                                           "moe_flashinfer", "moe_liger"}
    assert gates("kernel", "moe_triton") and not gates("kernel", "moe_grouped") and not gates("kernel", "moe_flashinfer")
    assert not gates("kernel", "moe_liger")
    assert gates("kernel", "cuda") and gates("e2e", "torch") and gates("acceptance", "cuda")
    assert not gates("kernel", "torch") and not gates("kernel", "flashinfer_cascade")
    assert not gates("kernel", "numpy_ref") and not gates("kernel", "an_old_backend")
    assert gates("topology", "torch") and gates("topology", "cuda") and gates("replay", "torch")
    assert not gates("topology", "nccl") and not gates("topology", "gloo")   # collective microbenchmarks
    assert not gates("a_later_kind", "torch") and not gates("e2e", "an_old_backend")   # only what is stated


def test_collective_row_backends_are_labelled_context_and_cannot_be_named():
    """nccl / gloo rows (the topology kind's microbenchmarks) are not entries: a scenario cannot name them,
    they never gate, and report legends still say what they are."""
    for name in ("nccl", "gloo"):
        assert name not in registry.BACKENDS and name not in registry.for_kind("topology")
        assert "collectives" in registry.label(name) and "never gates" in registry.label(name)
        assert not any(gates(kind, name) for kind in ("kernel", *registry.GENERATION_KINDS))
    assert registry.label("cuda") == registry.BACKENDS["cuda"].label and registry.label("nope") == ""
    assert registry.for_kind("e2e") == ("torch", "cuda")
    assert "flashinfer_cascade" in registry.for_family("tree_verify_mla")
    assert "flashinfer_cascade" not in registry.for_family("tree_build")


def test_unavailable_reasons_on_cpu():
    ok, why = registry.available("flashinfer_cascade", "cpu")
    assert not ok and "--device cuda" in why
    ok, why = registry.available("cuda", "cpu")
    assert not ok and "--device cuda" in why
    assert registry.available("torch", "cpu") == (True, "")
    assert registry.available("nope", "cpu") == (False, "unknown backend 'nope'")


@pytest.mark.parametrize("cap, reason", [((9, 0), None), ((12, 0), "needs compute capability 9.0"),
                                          ((8, 0), "this GPU is 8.0")])
def test_sm90_pinned_backend_is_skipped_elsewhere(monkeypatch, cap, reason):
    """cuda_pingpong pins sm_90a code: on other GPUs its rows are skipped with the reason, not failed."""
    import torch
    monkeypatch.setattr(registry, "_cuda_extension", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cap)
    why = registry.BACKENDS["cuda_pingpong"].why_unavailable()
    assert why is None if reason is None else reason in why


def test_missing_flashinfer_says_how_to_install(monkeypatch):
    from kdbench.backends import flashinfer_mla
    monkeypatch.setitem(sys.modules, "flashinfer", None)   # import flashinfer raises ImportError
    assert "kdbench[peers]" in flashinfer_mla.unavailable_reason()


def test_liger_peer_says_why_it_cannot_run(monkeypatch):
    """Without a GPU, without the package, or at another version: a reason naming the fix, never an import error."""
    import torch
    from importlib import metadata

    from kdbench.backends import liger_moe
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA GPU" in liger_moe.unavailable_reason()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def missing(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "version", missing)
    assert "kdbench[peers]" in liger_moe.unavailable_reason()
    monkeypatch.setattr(metadata, "version", lambda name: "0.7.0")
    assert "0.7.0" in liger_moe.unavailable_reason() and liger_moe.VERSION in liger_moe.unavailable_reason()
    assert "liger" in registry.moe_dispatch_modes()


def test_liger_gate_up_layout_puts_the_gate_rows_first():
    import torch

    from kdbench.backends import liger_moe
    w1, w3 = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    got = liger_moe._gate_up(w1, w3)
    assert got.shape == (3, 8, 5) and torch.equal(got[:, :4], w1) and torch.equal(got[:, 4:], w3)


def test_round_orders_alternate():
    assert timing.round_orders(["a", "b", "c"], 4) == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"],
                                                      ["c", "b", "a"]]


def test_rounds_interleave_keep_first_and_last_outputs_and_drop_a_failure():
    calls: list[str] = []
    count = {"a": 0}

    def a():
        calls.append("a")
        count["a"] += 1
        return count["a"]

    def boom():
        raise RuntimeError("no")

    res = timing.rounds({"a": timing.Contender(a, "cpu"), "b": timing.Contender(lambda: calls.append("b"), "cpu"),
                         "x": timing.Contender(boom, "cpu")}, warmup=0, repeat=7, n_rounds=4, keep_outputs=True)
    assert len(res["a"].samples_s) == 7 and len(res["b"].samples_s) == 7
    assert isinstance(res["x"], RuntimeError)
    assert res["a"].outputs == [1, 7]
    assert "".join(calls) == "aabb" + "bbaa" + "aabb" + "ba"   # 2, 2, 2, 1 samples per round, ABBA order


# ---------------------------------------------------------------------------------------------- one entry

def _tree_accept_case(backends) -> str:
    return f"""name: planted
kind: kernel
seed: 3
cases:
  - name: accept
    family: tree_accept
    backends: {backends}
    shape: {{batch: 3, budget: 9, vocab: 11, depth: 4}}
    trials: 2
    timing: {{warmup: 1, repeat: 4}}
"""


@pytest.fixture
def planted(monkeypatch):
    """Adds backends `honest` (torch_ops) and `lazy` (right on a fresh input, wrong on a repeated call of the
    same tensors: the shape of a kernel that is fast because it skips work) as registry entries."""
    module = types.ModuleType("kdbench_planted")

    def lazy(tokens, first_child, next_sibling, n_nodes, target, depth):
        res = torch_ops.tree_accept_greedy(tokens, first_child, next_sibling, n_nodes, target, depth)
        if getattr(tokens, "_kdb_seen", False):   # a repeated call on the same tensor object
            res.accept_len.zero_()
        tokens._kdb_seen = True
        return res

    module.tree_accept_greedy, module.tree_accept_sampled = lazy, torch_ops.tree_accept_sampled
    monkeypatch.setitem(sys.modules, "kdbench_planted", module)
    extra = (registry.Backend("honest", "peer", ("tree_accept",), ("kernel",), "any", "kdbench.backends.torch_ops",
                              "torch ops under another name"),
             registry.Backend("lazy", "ours", ("tree_accept",), ("kernel",), "any", "kdbench_planted", "skips work"))
    monkeypatch.setattr(registry, "ENTRIES", registry.ENTRIES + extra)
    monkeypatch.setattr(registry, "BACKENDS", {**registry.BACKENDS, **{b.name: b for b in extra}})


def _run(tmp_path, text):
    from kdbench import runner
    path = tmp_path / "planted.yaml"
    path.write_text(text)
    return {r.backend: r for r in runner.run_scenarios([str(path)], str(tmp_path / "run"), "cpu",
                                                       progress=False).records}


def test_a_planted_entry_is_validated_dispatched_and_timed(planted, tmp_path):
    recs = _run(tmp_path, _tree_accept_case("[torch, honest]"))
    assert recs["honest"].status == "pass" and recs["honest"].n_samples == 4
    assert recs["honest"].trials == 4     # 2 trials + the first and the last timed call


def test_a_backend_that_skips_work_when_repeated_fails_after_timing(planted, tmp_path):
    recs = _run(tmp_path, _tree_accept_case("[lazy]"))
    assert recs["lazy"].status == "fail", recs["lazy"].reason


def test_an_unknown_backend_is_refused_with_the_registry_list(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(_tree_accept_case("[nope]"))
    with pytest.raises(config.ScenarioError, match="expected one of numpy_ref, torch, cuda"):
        config.load(path)


@pytest.mark.parametrize("kind", ["acceptance", "e2e"])
def test_generation_kinds_skip_an_unavailable_backend_and_keep_the_others(tmp_path, kind):
    from kdbench import runner
    path = tmp_path / f"{kind}.yaml"
    path.write_text(f"""name: gen
kind: {kind}
seed: 5
cases:
  - name: both
    backends: [cuda, torch]
    shape: {{model: tiny, policy: ddtree, budget: 4, prompts: 2, prompt_len: 6, max_new_tokens: 6,
            drafter: synthetic, quality: 0.8, batch: 2}}
""")
    recs = runner.run_scenarios([str(path)], str(tmp_path / "run"), "cpu", progress=False).records
    by = {(r.backend, r.policy) for r in recs}
    cuda = [r for r in recs if r.backend == "cuda"]
    assert len(cuda) == 1 and cuda[0].status == "skipped" and "--device cuda" in cuda[0].reason
    assert ("torch", "ddtree(B=4)") in by and all(r.status != "error" for r in recs)
    assert all(r.family == "" for r in recs)


def test_old_generation_records_load_with_the_policy_column(tmp_path):
    import json

    from kdbench.results import load_records
    old = {"scenario": "e", "kind": "e2e", "case": "c", "family": "ddtree(B=64)", "backend": "torch"}
    kernel = {"scenario": "k", "kind": "kernel", "case": "c", "family": "tree_build", "backend": "torch"}
    (tmp_path / "records.jsonl").write_text("\n".join(json.dumps(r) for r in (old, kernel)) + "\n")
    e2e, kern = load_records(tmp_path)
    assert (e2e.family, e2e.policy) == ("", "ddtree(B=64)")
    assert (kern.family, kern.policy) == ("tree_build", "")


def test_old_replay_and_topology_records_load_with_policy_and_phase(tmp_path):
    """Replay rows kept the policy label, topology rows the phase, in `family` (those records already had an
    empty policy column); both move, a kernel row's family stays."""
    import json

    from kdbench.results import load_records
    blank = {"policy": "", "dtype": "float32"}
    rows = [{"scenario": "r", "kind": "replay", "case": "c", "family": "ddtree(B=8)", "backend": "torch", **blank},
            {"scenario": "t", "kind": "topology", "case": "c", "family": "comm:all_reduce:4096", "backend": "gloo",
             **blank},
            {"scenario": "t", "kind": "topology", "case": "c", "family": "verify", "backend": "torch", **blank},
            {"scenario": "k", "kind": "kernel", "case": "c", "family": "kv_compact", "backend": "torch", **blank}]
    (tmp_path / "records.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = [(r.family, r.policy, r.phase) for r in load_records(tmp_path)]
    assert got == [("", "ddtree(B=8)", ""), ("", "", "comm:all_reduce:4096"), ("", "", "verify"),
                   ("kv_compact", "", "")]


def test_every_scenario_kind_is_in_the_registry_and_has_a_shape():
    """A kind added to kinds.KINDS without a registry entry would accept no backend (or every one)."""
    assert set(kinds.KINDS) == {"kernel", *registry.GENERATION_KINDS}
    assert set(shapes.KIND_SHAPES) == set(registry.GENERATION_KINDS)
    assert all(registry.for_kind(k) for k in kinds.KINDS)
    assert set(POLICY_KINDS) < set(kinds.KINDS)
