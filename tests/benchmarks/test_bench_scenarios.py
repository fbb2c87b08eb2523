"""pytest-benchmark timings of the measurement plumbing: loading + expanding a large sweep, the comparison
helper on a 1M-element output, the U test on 1000 + 1000 samples.

Run with `python -m pytest tests/benchmarks/test_bench_scenarios.py --benchmark-only`. Napkin math: the
sweep below expands to 6 x 6 x 4 x 3 x 2 = 864 cases; compare() reads 2 x 8 MB float64.
"""
import numpy as np

from kdbench import config
from kdbench.check import compare
from kdbench.config import Tolerance
from kdbench.regress import mann_whitney_u

ROUNDS = dict(rounds=5, iterations=1, warmup_rounds=1)

SWEEP = """
name: big_sweep
kind: kernel
seed: 1
cases:
  - name: tree_build
    family: tree_build
    backends: [numpy_ref, torch, cuda]
    shape: {batch: 4, budget: 64, vocab: 32000}
    sweep:
      shape.budget: [1, 16, 64, 256, 512, 1024]
      shape.batch: [1, 2, 8, 16, 32, 64]
      shape.vocab: [1000, 32000, 129280, 163840]
      shape.logits: [random, ties, peaked]
      dtype: [float32, bfloat16]
    tolerance: {rtol: 0, atol: 0}
"""


def test_bench_load_and_expand_sweep(benchmark, tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(SWEEP)
    scenario = benchmark.pedantic(config.load, args=(path,), **ROUNDS)
    assert len(scenario.cases) == 6 * 6 * 4 * 3 * 2
    assert len({c.seed for c in scenario.cases}) == len(scenario.cases)    # a distinct seed per case
    benchmark.extra_info["cases"] = len(scenario.cases)


def test_bench_load_nightly_scenarios(benchmark):
    from kdbench.nightly import scenario_paths
    paths = scenario_paths()
    scenarios = benchmark.pedantic(lambda: [config.load(p) for p in paths], **ROUNDS)
    assert all(s.cases for s in scenarios)


def test_bench_compare_1m_elements(benchmark):
    rng = np.random.default_rng(0)
    want = rng.standard_normal(1 << 20)
    got = want.astype(np.float32)
    res = benchmark.pedantic(compare, args=(got, want, Tolerance(rtol=1e-5, atol=1e-6)), **ROUNDS)
    assert res.passed
    benchmark.extra_info["bytes"] = 2 * want.nbytes


def test_bench_u_test_1000_samples(benchmark):
    rng = np.random.default_rng(1)
    a, b = rng.lognormal(0, 0.05, 1000), rng.lognormal(0.01, 0.05, 1000)
    u, p = benchmark.pedantic(mann_whitney_u, args=(a, b), **ROUNDS)
    assert 0 <= p <= 1 and 0 <= u <= 1000 * 1000
