"""Exact offline replay of greedy tree policies over a trace (plans/0009-traces-replay.md).

A round at generated index j builds the policy's tree from the trace's top-K at j with the engine's own
builder (Policy.build_one, the function torch_ops.tree_build calls), then walks it with the reference greedy
accept, where the target's token at a node is the continuation's next token if the node's path is the
continuation (the walk never leaves that path). tau = accepted nodes incl. the root; the next round is j+tau.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdbench.engine.stages import Policy
from kdbench.intervals import ratio_interval
from kdbench.references.tree_accept import accept_greedy
from kdbench.references.tree_build import Tree

from .trace import Trace


@dataclass(frozen=True)
class PromptReplay:
    starts: tuple[int, ...]   # generated index j of each round's bonus token
    tau: tuple[int, ...]      # tokens committed per round, counting the bonus
    nodes: tuple[int, ...]    # tree rows per round incl. the root (the verify pass's rows)


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    max_new_tokens: int
    prompts: tuple[PromptReplay, ...]
    categories: tuple[str, ...]

    @property
    def mean_tau(self) -> float:
        """Committed tokens per (request, round): GenerateResult.mean_tau's definition."""
        taus = [t for p in self.prompts for t in p.tau]
        return float(np.mean(taus)) if taus else float("nan")

    @property
    def mean_nodes(self) -> float:
        rows = [n for p in self.prompts for n in p.nodes]
        return float(np.mean(rows)) if rows else float("nan")

    def tau_interval(self):
        """mean_tau's 95 % interval over the trace's prompts (intervals.ratio_interval: tokens / rounds)."""
        return ratio_interval([sum(p.tau) for p in self.prompts], [len(p.tau) for p in self.prompts])

    def per_prompt(self) -> list[float]:
        return [float(np.mean(p.tau)) if p.tau else float("nan") for p in self.prompts]

    def per_category(self) -> dict[str, float]:
        out: dict[str, list[int]] = {}
        for cat, p in zip(self.categories, self.prompts):
            out.setdefault(cat, []).extend(p.tau)
        return {c: float(np.mean(v)) for c, v in out.items()}


def check_fits(trace: Trace, policy: Policy) -> None:
    """The trace's top-K must cover what the policy reads (Lemma 1: DDTree needs K >= min(budget, V))."""
    if policy.kind == "ar":
        raise ValueError("policy 'ar' has no tree to replay (its tau is 1)")
    need = {"chain": 1, "ddtree": policy.budget, "adaptive": policy.budget,
            "ddtree_width_capped": min(policy.budget, policy.max_width),
            "static_kary": max(policy.branching or (1,))}[policy.kind]
    vocab = trace.meta.get("vocab_size")
    if need > trace.k and not (vocab and trace.k >= vocab):
        raise ValueError(f"policy {policy.label} needs top-{need} drafts; the trace holds top-{trace.k}")
    policy.nodes(trace.depth)   # a static tree deeper than the drafter raises here


def replay(trace: Trace, policy: Policy, max_new_tokens: int | None = None) -> ReplayResult:
    """Every prompt of the trace under `policy`, generating max_new_tokens (default: all the trace covers,
    rounds + 1) as generate() would: rounds run while fewer than max_new_tokens tokens are generated."""
    check_fits(trace, policy)
    M = trace.rounds + 1 if max_new_tokens is None else int(max_new_tokens)
    if not 2 <= M <= trace.rounds + 1:
        raise ValueError(f"max_new_tokens must be in 2..{trace.rounds + 1} for this trace, got {M}")
    build = policy.build_one()
    out = []
    for p in range(trace.n_prompts):
        cont = trace.continuation[p]
        starts, taus, nodes = [], [], []
        j = 0
        while j + 1 < M:
            tree = build(trace.top_lp[p, j].astype(np.float64), trace.top_tok[p, j].astype(np.int64),
                         policy.budget, int(cont[j]))
            tau = accept_length(tree, cont, j)
            starts.append(j)
            taus.append(tau)
            nodes.append(tree.size)
            j += tau
        out.append(PromptReplay(tuple(starts), tuple(taus), tuple(nodes)))
    return ReplayResult(policy.label, M, tuple(out), trace.categories)


def accept_length(tree: Tree, cont: np.ndarray, j: int) -> int:
    """tau of the round whose bonus is cont[j]: the greedy walk with the continuation as the target."""
    on_path = np.zeros(tree.size, dtype=bool)
    on_path[0] = True
    for i in range(1, tree.size):   # parents precede children (pop order)
        on_path[i] = on_path[tree.parents[i]] and tree.tokens[i] == cont[j + tree.depths[i]]
    target = np.where(on_path, cont[np.minimum(j + tree.depths + 1, len(cont) - 1)], -1)
    accepted, bonus = accept_greedy(tree, target.astype(np.int64))
    assert bonus == cont[j + len(accepted)], "the walk must end on the continuation"
    return len(accepted)


def live_taus(result) -> list[list[int]]:
    """Per request, the tau of each round it ran, from a generate() result (rounds after it finished
    report tau 0 and are dropped): the sequence replay() must reproduce."""
    B = len(result.tokens)
    return [[s.tau[b] for s in result.steps if s.tau[b] > 0] for b in range(B)]
