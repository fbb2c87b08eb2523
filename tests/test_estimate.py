"""Every scenario in the repository either fits a CPU machine or is refused there with its estimate, before
anything is allocated; `kdbench list` says which. The machine is fixed (16 GB, no GPU) so the verdicts do not
depend on where the tests run."""
from __future__ import annotations

from pathlib import Path

import pytest

from kdbench import cli, config, estimate

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("**/*.yaml"))
CPU16 = estimate.Machine("cpu", 16e9, 0.0)
# GPU-sized on a 16 GB CPU machine: real-width models, the 24 GB kv_compact bench, the verify grid; topology
# has no backend that runs on a CPU.
REFUSED = {"acceptance/h200_slice2.yaml", "e2e/h200_slice2.yaml", "kernels/kv_compact.yaml",
           "kernels/tree_verify_mla.yaml", "topology/nvlink_vs_pcie.yaml"}


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT / "scenarios"))


@pytest.mark.parametrize("path", SCENARIOS, ids=_name)
def test_every_scenario_fits_a_cpu_or_is_refused_with_its_estimate(path):
    s = config.load(path)
    fits, why = estimate.verdict(list(s.cases), CPU16)
    if _name(path) in REFUSED:   # the GPU-sized ones known today must stay refused (new files: either way)
        assert not fits
    if not fits:
        assert "needs ~" in why and "GB" in why or "no backend" in why, why
    else:
        peak = max(max(estimate.case(c, "cpu").host_bytes, estimate.case(c, "cpu").device_bytes) for c in s.cases)
        assert peak <= estimate.HEADROOM * CPU16.host_bytes


def test_a_refused_run_exits_2_with_the_estimate_and_allocates_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(estimate, "machine", lambda device: CPU16)
    made = []
    monkeypatch.setattr("kdbench.families.kv_compact.make_inputs", lambda *a: made.append(a))
    out = tmp_path / "run"
    assert cli.main(["run", str(ROOT / "scenarios/kernels/kv_compact.yaml"), "--device", "cpu",
                     "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "refused on cpu" in err and "bench[batch=128] needs ~23" in err and "--force" in err
    assert not made and not (out / "records.jsonl").exists()


def test_force_runs_a_refused_selection(monkeypatch, tmp_path):
    monkeypatch.setattr(estimate, "machine", lambda device: estimate.Machine("cpu", 1e3, 0.0))   # 1 kB
    path = ROOT / "scenarios/nightly/verify.yaml"
    args = ["run", str(path), "--device", "cpu", "--filter", "tree_verify_mla_chain_single"]
    assert cli.main(args + ["--out", str(tmp_path / "a")]) == 2
    assert cli.main(args + ["--out", str(tmp_path / "b"), "--force"]) == 0


def test_estimates_grow_with_the_shape():
    s = config.load(ROOT / "scenarios/kernels/kv_compact.yaml")
    by_batch = {c.shape.batch: estimate.case(c, "cpu").host_bytes for c in s.cases if c.name.startswith("bench")}
    assert by_batch[8] < by_batch[64] < by_batch[128]
    # 61 layers x 128 requests x 81 rows x 576 x 64 bytes: the 24 GB that got this case OOM-killed on a CPU
    assert 20e9 < by_batch[128] < 30e9


def test_an_unavailable_backend_costs_nothing():
    s = config.load(ROOT / "scenarios/kernels/tree_verify_mla.yaml")
    cuda_only = next(c for c in s.cases if c.backends == ("cuda",))
    assert estimate.case(cuda_only, "cpu") == estimate.Estimate(0.0, 0.0, 0.0)


def test_list_shows_the_verdicts(capsys):
    assert cli.main(["list", "--root", str(ROOT / "scenarios")]) == 0
    out = capsys.readouterr().out
    assert "tree_verify_mla.yaml  (kernel" in out and "refused: case bench" in out
    assert "smoke.yaml  (kernel, 9 cases) fits:" in out
