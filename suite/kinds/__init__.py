"""Scenario kinds: each module has run(case, ctx) -> iterator of Records."""
from __future__ import annotations

import importlib
from collections.abc import Iterator

KINDS = ("kernel", "acceptance", "e2e", "topology", "replay")


def run_case(case, ctx) -> Iterator:
    module = importlib.import_module(f"kdbench.kinds.{case.kind}")
    yield from module.run(case, ctx)
