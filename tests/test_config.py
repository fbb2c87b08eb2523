"""Scenario schema: expansion, seeds, filters, and one clear error per kind of bad input."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from kdbench import config
from kdbench.errors import ScenarioError, UserError

BAD = Path(__file__).parent / "data" / "bad_scenarios"

# file -> (key path in the message, a fragment of what was expected)
EXPECTED = {
    "unknown_key.yaml": ("cases[0].shape.colour", "valid keys at cases[0].shape: batch, budget, vocab"),
    "wrong_type.yaml": ("cases[0].shape.batch", "got 'two', expected an integer"),
    "missing_field.yaml": ("cases[0].shape.budget", "missing required key"),
    "unknown_preset.yaml": ("cases[0].shape.model", "expected a preset: deepseek-v3, kdbench-pair, kimi-k2"),
    "empty.yaml": ("empty.yaml", "the file is empty"),
    "not_yaml.yaml": ("not_yaml.yaml", "not valid YAML (line"),
    "duplicate_case.yaml": ("cases", "duplicate case name 'a'"),
    "negative_budget.yaml": ("cases[0].shape.budget", "got -3, expected a tree budget in 0..1024"),
    "unknown_backend.yaml": ("cases[0].backends[1]", "got 'triton', expected one of numpy_ref, torch, cpu_heap, cuda"),
    "bad_tolerance.yaml": ("cases[0].tolerance.rtol", "got -0.1, expected a finite number >= 0"),
    "unknown_family.yaml": ("cases[0].family", "expected a kernel family: tree_build"),
    "sweep_out_of_range.yaml": ("cases[0].sweep.shape.budget", "value 2000: got 2000, expected a tree budget"),
    "not_a_mapping.yaml": ("not_a_mapping.yaml", "expected a mapping with keys name, kind, cases"),
    "no_cases.yaml": ("cases", "expected at least one case"),
    # issue 14: values that cannot run, parser-level errors and unbounded input, all refused at load time
    "duplicate_yaml_key.yaml": ("line 7", "duplicate key 'shape'"),
    "int_too_long.yaml": ("int_too_long.yaml", "not valid YAML: ValueError: Exceeds the limit"),
    "infinite_tolerance.yaml": ("cases[0].tolerance.rtol", "got inf, expected a finite number >= 0"),
    "huge_batch.yaml": ("cases[0].shape.batch", "expected an integer in 1..2147483647"),
    "backend_twice.yaml": ("cases[0].backends", "'torch' is listed twice"),
    "bad_timeout.yaml": ("case_timeout_s", "got 0.0, expected seconds in (0, 86400]"),
    "infinite_temperature.yaml": ("cases[0].shape.temperature", "got inf, expected a finite number >= 0"),
    "generation_too_long.yaml": ("cases[0].shape.max_new_tokens", "= 1165 exceeds tiny's max_seq_len 1024"),
    "static_kary_too_big.yaml": ("cases[0].shape.branching", "4680-node tree, above the limit 1024"),
    "quality_zero.yaml": ("cases[0].shape.quality", "got 0.0, expected a probability in (0, 1]"),
    "huge_sweep.yaml": ("cases[0].sweep", "expand to 1000000000 cases, more than the limit of 5000"),
    "alias_bomb.yaml": ("alias_bomb.yaml", "expands to more than 200000 nodes through aliases"),
    "merge_bomb.yaml": ("merge_bomb.yaml", "expands to more than 200000 nodes through aliases/merge keys"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_scenario_names_file_path_and_expectation(name):
    path, fragment = EXPECTED[name]
    with pytest.raises(ScenarioError) as err:
        config.load(BAD / name)
    message = str(err.value)
    assert str(BAD / name) in message and path in message and fragment in message, message
    assert "\n" not in message


@pytest.mark.parametrize("name", ["alias_bomb.yaml", "merge_bomb.yaml", "huge_sweep.yaml", "huge_batch.yaml"])
def test_unbounded_input_is_refused_within_a_second(name):
    t0 = time.perf_counter()
    with pytest.raises(ScenarioError):
        config.load(BAD / name)
    assert time.perf_counter() - t0 < 1.0


def test_max_cases_is_a_parameter(tmp_path):
    path = _write(tmp_path, "name: s\nkind: kernel\ncases:\n  - name: a\n    family: kv_compact\n"
                            "    shape: {batch: 1, budget: 2, past_len: 3}\n    sweep: {shape.batch: [1, 2, 3]}\n")
    assert len(config.load(path, max_cases=3).cases) == 3
    with pytest.raises(ScenarioError, match="expand to 3 cases, more than the limit of 2"):
        config.load(path, max_cases=2)


def test_a_merged_key_may_be_overridden(tmp_path):
    base = ("name: s\nkind: kernel\nbase: &b {batch: 1, budget: 2, past_len: 3}\ncases:\n  - name: a\n"
            "    family: kv_compact\n    shape: {<<: *b, batch: 2}\n")
    with pytest.raises(ScenarioError, match="base: unknown key"):   # parsed fine; only the extra key is wrong
        config.load(_write(tmp_path, base))


def test_every_bad_file_is_covered():
    assert sorted(p.name for p in BAD.glob("*.yaml")) == sorted(EXPECTED)


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def test_sweep_expands_cartesian_product_with_stable_distinct_seeds(tmp_path):
    path = _write(tmp_path, """
name: s
kind: kernel
seed: 5
cases:
  - name: tb
    family: tree_build
    shape: {batch: 2, budget: 8, vocab: 100}
    sweep: {shape.budget: [1, 7, 64], dtype: [float32, bfloat16]}
""")
    s = config.load(path)
    assert [c.name for c in s.cases][:2] == ["tb[budget=1,dtype=float32]", "tb[budget=1,dtype=bfloat16]"]
    assert len(s.cases) == 6 and len({c.seed for c in s.cases}) == 6
    assert [c.shape.budget for c in s.cases] == [1, 1, 7, 7, 64, 64]
    assert config.load(path).cases[3].seed == s.cases[3].seed   # same file -> same seeds
    assert s.text == path.read_text()


def test_filter_terms_and_exact_names(tmp_path):
    s = config.load(Path(__file__).parents[1] / "scenarios" / "smoke.yaml")
    names = [c.name for c in s.cases if config.matches(c, "family=tree_accept")]
    assert names == ["tree_accept[mode=greedy]", "tree_accept[mode=sampled]"]
    exact = "tree_build[budget=16,logits=peaked]"
    assert [c.name for c in s.cases if config.matches(c, exact)] == [exact]
    assert [c.name for c in s.cases if config.matches(c, "budget=1,random")] == ["tree_build[budget=1,logits=random]"]


def test_several_filters_select_the_union_in_file_order():
    cases = list(config.load(Path(__file__).parents[1] / "scenarios" / "smoke.yaml").cases)
    exact = "tree_build[budget=16,logits=peaked]"
    names = [c.name for c in config.select(cases, ["family=tree_accept", exact])]
    assert names == [exact, "tree_accept[mode=greedy]", "tree_accept[mode=sampled]"]
    assert [c.name for c in config.select(cases, ["tree_verify_mla"])] == ["tree_verify_mla"]   # exact wins
    assert config.select(cases, None) == cases
    with pytest.raises(UserError, match="'no-such' matches no case in smoke"):
        config.select(cases, ["family=tree_accept", "no-such"], "smoke")


def test_filter_selects_cases_not_names_across_files():
    """`chain` is a case in both e2e files: a filter on a shape key picks the one case, not every namesake."""
    root = Path(__file__).parents[1] / "scenarios" / "e2e"
    cases = [c for f in ("tiny_cpu.yaml", "h200_slice2.yaml") for c in config.load(root / f).cases]
    chains = [c for c in cases if c.name == "chain"]
    assert len(chains) == 2 and chains[0].shape.batch != chains[1].shape.batch
    picked = config.select(cases, [f"chain,batch={chains[0].shape.batch}"])
    assert picked == [chains[0]]


def test_sweep_axis_must_be_dtype_or_shape_key(tmp_path):
    path = _write(tmp_path, "name: s\nkind: kernel\ncases:\n  - name: a\n    family: kv_compact\n"
                            "    shape: {batch: 1, budget: 2, past_len: 3}\n    sweep: {trials: [1, 2]}\n")
    with pytest.raises(ScenarioError, match=r"cases\[0\]\.sweep\.trials: unknown sweep axis"):
        config.load(path)


def test_generation_kinds_take_engine_backends_only(tmp_path):
    path = _write(tmp_path, "name: s\nkind: acceptance\ncases:\n  - name: a\n    backends: [numpy_ref]\n"
                            "    shape: {model: tiny}\n")
    with pytest.raises(ScenarioError, match=r"cases\[0\]\.backends\[0\]: got 'numpy_ref', expected one of torch"):
        config.load(path)


@pytest.mark.parametrize("shape, path, fragment", [
    ("{model: tiny, category: repetitve}", "shape.category", "expected one of 'random', 'repetitive'"),
    ("{model: tiny, max_new_tokens: 0}", "shape.max_new_tokens", "expected >= 2"),
    ("{model: tiny, policy: static_kary, branching: [2, 0]}", "shape.branching", "integers >= 1"),
])
def test_generation_shape_mistakes_stop_before_running(tmp_path, shape, path, fragment):
    p = _write(tmp_path, f"name: s\nkind: acceptance\ncases:\n  - name: a\n    shape: {shape}\n")
    with pytest.raises(ScenarioError, match=rf"cases\[0\]\.{path}: .*{fragment}"):
        config.load(p)
