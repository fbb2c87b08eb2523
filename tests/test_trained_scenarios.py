"""The trained pair through the scenario runner on CPU: the CI acceptance case (scenarios/acceptance/
trained_smoke.yaml: greedy output equals AR, tau per prompt and per category) and a small e2e case (every
row records its graph mode; the torch backend says why no graph)."""
from __future__ import annotations

import json
from pathlib import Path

from kdbench import cli

ROOT = Path(__file__).parents[1]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]


def test_trained_smoke_acceptance(tmp_path):
    run = tmp_path / "run"
    assert cli.main(["run", str(ROOT / "scenarios/acceptance/trained_smoke.yaml"), "--device", "cpu",
                     "--out", str(run)]) == 0
    (rec,) = _records(run)
    assert rec["status"] == "pass" and rec["lossless"] == "yes"
    assert len(rec["extra"]["tau_per_prompt"]) == 6 and set(rec["extra"]["tau_per_category"]) == {
        "code", "prose", "structured"}
    assert 1.0 < rec["tau"] <= 16 and rec["extra"]["drafter"].startswith("trained")
    assert "ddtree vs chain" not in (run / "report.html").read_text()      # no chain arm in this run


def test_trained_e2e_records_graph_mode(tmp_path):
    yaml = tmp_path / "e2e.yaml"
    yaml.write_text("name: e2e-trained-cpu\nkind: e2e\nseed: 3\ncases:\n  - name: ddtree\n    backends: [torch]\n"
                    "    shape: {model: kdbench-pair, drafter: trained, policy: ddtree, budget: 8, batch: 2, prompts: 1,\n"
                    "            category: prose, prompt_len: 32, max_new_tokens: 8}\n")
    run = tmp_path / "run"
    assert cli.main(["run", str(yaml), "--device", "cpu", "--out", str(run)]) == 0
    ar, spec = _records(run)
    assert ar["extra"]["graph_mode"] == spec["extra"]["graph_mode"] == "eager"
    assert spec["extra"]["ar_graph_mode"] == "eager"          # both arms in one mode, each recorded
    assert "CUDA" in spec["extra"]["graph_reason"] and spec["extra"]["graph_reason"] == ar["extra"]["graph_reason"]
    assert spec["predicted_speedup"] > 0 and spec["extra"]["predicted_over_measured"] > 0
