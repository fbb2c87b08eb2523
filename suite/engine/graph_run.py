"""A whole generation in graph mode: one CUDA graph of the step (AR, DDTree or chain) captured from the
post-prefill state, replayed until every request is done, each replay timed by CUDA events. The e2e kind runs
both arms this way when both can be captured (plans/0003-engine.md, "Graph-mode generation")."""
from __future__ import annotations

import torch

from . import graph
from .records import GenerateResult, StepRecord
from .stages import Policy


def generate_graphed(model, drafter, prompts: list[list[int]], max_new_tokens: int, policy: Policy,
                     temperature: float = 0.0, seed: int = 0, backend: str = "cuda") -> GenerateResult:
    """generate() with every step a replay of one captured step (whole-cache bucket: valid for any number of
    steps). The tokens are generate()'s: the captured kernels are the eager step's, on the same inputs (bf16
    MoE combines with atomics may still round differently run to run, in eager mode too).

    Each StepRecord's stage_ns has one entry, "step": CUDA events around the replay (the stages of a graph are
    one launch and are not timed apart). prefill_ns is the prefill alone; the warm-up and the capture are not
    counted. Raises ValueError / graph.GraphUnavailable as graph.capture_step does (capture_reason says which
    before trying).
    """
    sg = graph.capture_step(model, drafter, prompts, policy, backend, max_new_tokens=max_new_tokens,
                            temperature=temperature, seed=seed, rewind=True)
    result = GenerateResult(tokens=[], policy=policy.label, temperature=float(temperature),
                            drafter=getattr(drafter, "name", "") if policy.kind != "ar" else "", backend=backend,
                            attention=sg.run.stages.attn, graph_mode="graph")
    result.prefill_ns = sg.state.prefill_ns
    while not all(sg.state.done.tolist()):             # the between-steps host read, as generate()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        sg.replay()
        end.record()
        end.synchronize()
        tau, size = sg.tau.tolist(), sg.tree_size.tolist()
        result.steps.append(StepRecord(len(result.steps), tuple(tau), tuple(max(t - 1, 0) for t in tau),
                                       tuple(size), {"step": int(begin.elapsed_time(end) * 1e6)}))   # ms -> ns
    result.tokens = sg.tokens()
    return result
