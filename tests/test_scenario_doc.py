"""scenarios/README.md documents every key of the scenario schema, and nothing else (a stale doc fails)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from kdbench import config, shapes

DOC = (Path(__file__).parents[1] / "scenarios" / "README.md").read_text()

SECTIONS = {
    "## Top level (`ScenarioSpec`)": config.ScenarioSpec,
    "## A case (`CaseSpec`)": config.CaseSpec,
    "### tree_build": shapes.TreeBuildShape,
    "### tree_verify_mla": shapes.TreeVerifyMlaShape,
    "### tree_accept": shapes.TreeAcceptShape,
    "### kv_compact": shapes.KvCompactShape,
    "### moe_experts": shapes.MoeExpertsShape,
    "## acceptance and e2e kinds: shape (`GenerationShape`)": shapes.GenerationShape,
    "## topology kind: shape (`TopologyShape`)": shapes.TopologyShape,
    "## replay kind: shape (`ReplayShape`)": shapes.ReplayShape,
}


def _documented_keys(heading: str) -> list[str]:
    start = DOC.index(heading) + len(heading)
    end = min((i for i in (DOC.find("\n#", start),) if i != -1), default=len(DOC))
    return re.findall(r"^\| `([a-z_0-9]+)` \|", DOC[start:end], flags=re.M)


@pytest.mark.parametrize("heading", sorted(SECTIONS))
def test_section_lists_exactly_the_dataclass_fields(heading):
    fields = [f.name for f in dataclasses.fields(SECTIONS[heading]) if f.init]
    assert _documented_keys(heading) == fields
