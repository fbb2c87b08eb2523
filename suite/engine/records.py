"""Per-step records of a generate() run, the run's result, and the stage timer (CUDA events on a GPU,
perf_counter_ns on the CPU; the GPU timer never synchronizes inside a step, only in finish())."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from kdbench.timing import stamp

STAGES = ("draft", "build", "verify", "accept", "compact", "commit")


@dataclass(frozen=True)
class StepRecord:
    """One engine step. Per-request tuples; a request that already finished has tau 0."""
    step: int
    tau: tuple[int, ...]             # tokens committed this step, counting the bonus/root (AR: 1)
    accepted_depth: tuple[int, ...]  # accepted draft tokens = tau - 1 (0 when finished)
    tree_size: tuple[int, ...]       # tree nodes incl. the root (AR: 1)
    stage_ns: dict[str, int]         # stage -> elapsed ns (the stages this policy ran)


@dataclass
class GenerateResult:
    tokens: list[list[int]]          # generated tokens per request (prompt excluded), max_new_tokens each
    steps: list[StepRecord] = field(default_factory=list)
    prefill_ns: int = 0
    policy: str = ""
    drafter: str = ""                # drafter name, e.g. "synthetic(q=0.8)"; "" for AR
    temperature: float = 0.0
    backend: str = "torch"
    attention: str = ""              # the attention that ran in verify / decode: "torch" when a cuda run's model is
                                     # not bf16 (the kernel reads bf16 caches), so a row can say what it timed
    state: object = None             # the final EngineState when generate(keep_state=True)
    graph_mode: str = "eager"        # "graph": every step was a CUDA-graph replay (graph_run.generate_graphed)

    @property
    def mean_tau(self) -> float:
        """Committed tokens per (request, step) over the steps where the request was still running:
        sum(tau) / count(tau > 0). AR gives 1.0."""
        taus = [t for s in self.steps for t in s.tau if t > 0]
        return sum(taus) / len(taus) if taus else 0.0

    def stage_totals_ns(self) -> dict[str, int]:
        """Sum over steps of each stage's time."""
        out: dict[str, int] = {}
        for s in self.steps:
            for k, v in s.stage_ns.items():
                out[k] = out.get(k, 0) + v
        return out


class StageTimer:
    """mark(name) closes the previous stage and opens `name`; finish() closes the last and returns ns."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.names: list[str] = []
        self.points: list = []

    def mark(self, name: str) -> None:
        self.names.append(name)
        self.points.append(stamp(self.cuda))

    def finish(self) -> dict[str, int]:
        self.points.append(stamp(self.cuda))
        if self.cuda:
            self.points[-1].synchronize()
            ns = [int(a.elapsed_time(b) * 1e6) for a, b in zip(self.points, self.points[1:])]  # ms -> ns
        else:
            ns = [b - a for a, b in zip(self.points, self.points[1:])]
        out = dict(zip(self.names, ns))
        self.names, self.points = [], []
        return out
