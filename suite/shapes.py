"""Per-family and per-kind `shape` dataclasses: what a scenario case may set, with defaults and limits.

Each `validate()` returns None or (key, message); schema.build turns that into a ScenarioError.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from kdbench.backends.registry import moe_dispatch_modes
from kdbench.references.model_config import get_preset, preset_names

MAX_BUDGET = 1024   # the engine's and the kernels' largest supported tree budget
MAX_DIM = 2**31 - 1  # every size field: the kernels index with int32 (a 23-digit batch would never finish)
MAX_LAYERS = 61     # model presets: the full DeepSeek-V3 / Kimi-K2 depth


def _positive(obj, *names) -> tuple[str, str] | None:
    for name in names:
        value = getattr(obj, name)
        if not 1 <= value <= MAX_DIM:
            return name, f"got {value}, expected an integer in 1..{MAX_DIM}"
    return None


def _budget(value: int, key: str = "budget") -> tuple[str, str] | None:
    if not 0 <= value <= MAX_BUDGET:
        return key, f"got {value}, expected a tree budget in 0..{MAX_BUDGET}"
    return None


@dataclass(frozen=True)
class TreeBuildShape:
    batch: int
    budget: int
    vocab: int
    depth: int = 15
    logits: Literal["random", "ties", "peaked"] = "random"
    ragged_budgets: bool = False     # per-request budgets drawn from 1..budget

    def validate(self):
        return _budget(self.budget) or _positive(self, "batch", "vocab", "depth")


@dataclass(frozen=True)
class TreeVerifyMlaShape:
    batch: int
    heads: int
    nodes: int                       # T = budget + 1 tree rows per request
    past_len: int
    ragged: bool = False             # past lengths drawn from 1..past_len per request
    tree: Literal["random", "chain"] = "random"
    kv_lora: int = 512
    rope: int = 64
    padding: int = 0                 # trailing rows per request with an all-zero mask (o = 0, lse = -inf)

    def validate(self):
        if not 1 <= self.nodes <= MAX_BUDGET + 1:
            return "nodes", f"got {self.nodes}, expected 1..{MAX_BUDGET + 1}"
        if not 0 <= self.padding < self.nodes:
            return "padding", f"got {self.padding}, expected 0..nodes-1 = {self.nodes - 1}"
        return _positive(self, "batch", "heads", "past_len", "kv_lora", "rope")


@dataclass(frozen=True)
class TreeAcceptShape:
    batch: int
    budget: int
    vocab: int
    depth: int = 15
    mode: Literal["greedy", "sampled"] = "greedy"

    def validate(self):
        return _budget(self.budget) or _positive(self, "batch", "vocab", "depth")


@dataclass(frozen=True)
class KvCompactShape:
    batch: int
    budget: int
    past_len: int
    layers: int = 2
    dim: int = 576
    depth: int = 15

    def validate(self):
        return _budget(self.budget) or _positive(self, "batch", "past_len", "layers", "dim", "depth")


@dataclass(frozen=True)
class MoeExpertsShape:
    """The routed experts of one MoE layer on `rows` token rows (decode: batch; verify: batch x T)."""
    rows: int
    hidden: int = 7168               # d
    inter: int = 2048                # expert intermediate width mi
    experts: int = 384               # E
    topk: int = 8                    # k experts per row
    routing: Literal["uniform", "same", "skewed"] = "uniform"   # same: every row picks one k-set; skewed: few hot

    def validate(self):
        bad = _positive(self, "rows", "hidden", "inter", "experts", "topk")
        if bad:
            return bad
        if self.topk > self.experts:
            return "topk", f"got {self.topk}, expected at most experts = {self.experts}"
        return None


Policy = Literal["ar", "chain", "ddtree", "ddtree_width_capped", "static_kary"]


def _preset(name: str):
    """(config, None) for a preset that exists and is at most the full model's depth, else (None, error)."""
    try:
        cfg = get_preset(name)
    except KeyError:
        return None, ("model", f"got {name!r}, expected a preset: {', '.join(preset_names())}")
    if cfg.n_layers > MAX_LAYERS:
        return None, ("model", f"got {cfg.n_layers} layers, expected at most {MAX_LAYERS} (the full model)")
    return cfg, None


@dataclass(frozen=True)
class GenerationShape:
    """Model-level cases (acceptance, e2e): which model, drafter, policy and sizes."""
    model: str
    policy: Policy = "ddtree"
    budget: int = 64
    batch: int = 1
    prompts: int = 4                 # number of prompts (acceptance) drawn per category
    prompt_len: int = 32
    max_new_tokens: int = 32
    temperature: float = 0.0
    drafter: Literal["block", "synthetic", "trained"] = "synthetic"
    quality: float = 0.8             # synthetic drafter: probability mass on the target's true token
    draft_len: int = 15              # L, the drafter's block horizon (separate from the tree budget)
    max_width: int = 4               # ddtree_width_capped
    branching: tuple[int, ...] = (4, 2, 1)  # static_kary: children per node at each depth
    category: Literal["random", "repetitive", "code", "prose", "structured", "mixed"] = "random"
    dtype: Literal["auto", "float32", "bfloat16", "float64"] = "auto"   # auto: bf16 on GPU, f64 tiny on CPU
    batch_invariant: bool = False    # batch-invariant target (plans/0010): greedy spec == AR bit for bit, any dtype
    moe: str = "auto"                # the target's MoE dispatch (registry moe_<moe>; plans/0015)
    forward_floor: bool = False      # e2e: time the AR and verify forwards per stage beside their floors (engine/floor.py)

    def validate(self):
        cfg, bad = _preset(self.model)
        if bad:
            return bad
        if self.moe not in moe_dispatch_modes():
            return "moe", f"got {self.moe!r}, expected one of {', '.join(moe_dispatch_modes())}"
        cfg = get_preset(self.model)
        if not 0 <= self.temperature < math.inf:
            return "temperature", f"got {self.temperature}, expected a finite number >= 0"
        if not 0.0 < self.quality <= 1.0:   # q = 0: the drafter never proposes the true token; cannot run
            return "quality", f"got {self.quality}, expected a probability in (0, 1]"
        if self.max_new_tokens < 2:
            return "max_new_tokens", (f"got {self.max_new_tokens}, expected >= 2 (the first token comes from "
                                      "prefill; steps make the rest)")
        bad = _pair_only(self)
        if bad:
            return bad
        return (_budget(self.budget) or _positive(self, "batch", "prompts", "prompt_len", "max_new_tokens",
                                                  "draft_len", "max_width")
                or self._fits(cfg.max_seq_len) or self._static_tree())

    def _fits(self, max_seq_len: int):
        """The KV cache holds prompt + generated tokens + one verify tree (budget + 1 rows)."""
        need = self.prompt_len + self.max_new_tokens + self.budget + 1
        if need > max_seq_len:
            return "max_new_tokens", (f"prompt_len {self.prompt_len} + max_new_tokens {self.max_new_tokens} + "
                                      f"budget {self.budget} + 1 = {need} exceeds {self.model}'s max_seq_len "
                                      f"{max_seq_len}")
        return None

    def _static_tree(self):
        return _static_tree(self.policy, self.branching, self.draft_len)


def _static_tree(policy: str, branching: tuple[int, ...], depth: int):
    """A static_kary tree must fit the drafter's depth and the budget limit."""
    if policy != "static_kary":
        return None
    if not branching or min(branching) < 1 or max(branching) > MAX_BUDGET:
        return "branching", f"got {list(branching)}, expected a non-empty list of integers >= 1 (each at most {MAX_BUDGET})"
    if len(branching) > depth:
        return "branching", f"{len(branching)} levels, deeper than the drafter (draft_len {depth})"
    nodes = sum(math.prod(branching[:d]) for d in range(1, len(branching) + 1))
    if nodes > MAX_BUDGET:
        return "branching", f"{list(branching)} makes a {nodes}-node tree, above the limit {MAX_BUDGET}"
    return None


TEXT_CATEGORIES = ("code", "prose", "structured")   # the trained pair's held-out prompt sets (mixed = all three)
PAIR_MODEL, PAIR_DEPTH, PAIR_PROMPTS, PAIR_PROMPT_LEN = "kdbench-pair", 15, 32, 256


def _pair_only(s) -> tuple[str, str] | None:
    """The trained drafter and the text prompt sets exist for the trained pair's target only."""
    text = s.category in TEXT_CATEGORIES + ("mixed",)
    if (s.drafter == "trained" or text) and s.model != PAIR_MODEL:
        key = "drafter" if s.drafter == "trained" else "category"
        return key, f"got {getattr(s, key)!r} with model {s.model!r}; it needs model {PAIR_MODEL}"
    if s.drafter == "trained" and s.draft_len != PAIR_DEPTH:
        return "draft_len", f"got {s.draft_len}, expected {PAIR_DEPTH} (the trained drafter's block is 16)"
    if text and s.prompts > PAIR_PROMPTS:
        return "prompts", f"got {s.prompts}, expected at most {PAIR_PROMPTS} (prompts per category shipped)"
    if text and s.prompt_len > PAIR_PROMPT_LEN:
        return "prompt_len", f"got {s.prompt_len}, expected at most {PAIR_PROMPT_LEN} for the text prompt sets"
    return None


def _nonneg(obj, *names):
    for name in names:
        if not 0 <= getattr(obj, name) <= MAX_DIM:
            return name, f"got {getattr(obj, name)}, expected an integer in 0..{MAX_DIM}"
    return None


@dataclass(frozen=True)
class TopologyShape:
    """Sharded runs (kdbench.parallel): prefill, AR decode and tree verify on `gpus` ranks, compared with one
    process, plus the collective microbenchmark. On --device cpu the ranks are gloo processes."""
    model: str
    gpus: int = 2                    # ranks: GPUs of one host (NCCL) or CPU processes (gloo)
    link: Literal["nvlink", "pcie", "auto"] = "auto"
    parallel: Literal["tp", "ep"] = "tp"
    ep_dispatch: Literal["padded", "exact"] = "padded"   # ep all-to-all: fixed capacity | exact sizes
    batch: int = 1
    budget: int = 64
    prompt_len: int = 32
    dtype: Literal["auto", "float32", "bfloat16", "float64"] = "auto"
    phases: tuple[Literal["prefill", "decode", "verify", "moe"], ...] = ("prefill", "decode", "verify", "moe")
    check: bool = True               # rank 0 also runs the one-process model and compares the logits
    warmup: int = 1
    repeat: int = 5
    timeout_s: float = 120.0         # collective timeout; the launcher kills the run at timeout_s + 60 s
    comm_bench: bool = False         # collective sweep 4 KiB .. comm_max_bytes + the step's own messages
    comm_max_bytes: int = 1 << 30
    fault: Literal["none", "raise", "kill", "hang"] = "none"   # inject a fault (tests of the launcher)
    fault_rank: int = 1

    def validate(self):
        _, bad = _preset(self.model)
        if bad:
            return bad
        if not 0 < self.timeout_s <= 3600:
            return "timeout_s", f"got {self.timeout_s}, expected seconds in (0, 3600]"
        if not 4096 <= self.comm_max_bytes <= 1 << 34:
            return "comm_max_bytes", f"got {self.comm_max_bytes}, expected 4096 .. {1 << 34} bytes"
        if self.gpus > 1024:
            return "gpus", f"got {self.gpus}, expected at most 1024 ranks"
        if not self.phases:
            return "phases", "got an empty list, expected phases from prefill, decode, verify, moe"
        return (_budget(self.budget) or _positive(self, "gpus", "batch", "prompt_len", "repeat")
                or _nonneg(self, "warmup", "fault_rank"))


REPLAY_DEPTH = 15   # the traced drafters' L (the keyed synthetic and block drafters' default)


@dataclass(frozen=True)
class ReplayShape:
    """Replay cases: a trace (recorded here, or a .kdtr file), one tree policy at one budget, tau replayed and the
    step time modeled at `batch` for the `cost_model` preset (plans/0009, plans/0008)."""
    model: str = "tiny"              # target preset the trace is recorded on (ignored with `trace` or synthetic-only)
    trace: str = ""                  # a .kdtr trace file; "" = record one with the keys below
    drafter: Literal["keyed", "block", "pair", "synthetic-only"] = "keyed"
    quality: float = 0.8             # synthetic drafters: probability mass on the true token
    prompts: int = 4
    prompt_len: int = 16
    category: Literal["random", "repetitive", "code", "prose", "structured", "mixed"] = "random"  # text: drafter pair
    rounds: int = 31                 # rounds recorded per prompt (max_new_tokens = rounds + 1)
    k: int = 64                      # top-K recorded per depth (>= the largest budget replayed)
    policy: Literal["chain", "ddtree", "ddtree_width_capped", "static_kary", "adaptive"] = "ddtree"
    budget: int = 64
    max_width: int = 4               # ddtree_width_capped
    branching: tuple[int, ...] = (4, 2, 1)  # static_kary
    row_cost: float = -1.0           # adaptive: one tree row's cost over a root-only step; < 0 = from the cost model
    batch: int = 1                   # batch size of the modeled step time
    cost_model: str = "kimi-k2-slice-2"  # preset whose step time is modeled (fit: suite/data/cost_fit_h200.json)
    ctx: int = 1024                  # committed context of the modeled step
    check_live: bool = False         # also run generate() live and require equal tau round by round

    def validate(self):
        cfgs = {}
        for key in ("model", "cost_model"):
            try:
                cfgs[key] = get_preset(getattr(self, key))
            except KeyError:
                return key, f"got {getattr(self, key)!r}, expected a model preset"
            if cfgs[key].n_layers > MAX_LAYERS:
                return key, f"got {cfgs[key].n_layers} layers, expected at most {MAX_LAYERS} (the full model)"
        if not 0.0 < self.quality <= 1.0:
            return "quality", f"got {self.quality}, expected a probability in (0, 1]"
        if self.drafter == "pair" and self.model != PAIR_MODEL:
            return "model", f"got {self.model!r} with drafter 'pair'; expected {PAIR_MODEL} (the trained pair's target)"
        if self.category in TEXT_CATEGORIES + ("mixed",) and self.drafter != "pair":
            return "category", f"got {self.category!r} with drafter {self.drafter!r}; the text prompt sets need drafter pair"
        if self.category in TEXT_CATEGORIES + ("mixed",) and (self.prompts > PAIR_PROMPTS
                                                             or self.prompt_len > PAIR_PROMPT_LEN):
            return "prompts", (f"got {self.prompts} x {self.prompt_len} tokens, expected at most {PAIR_PROMPTS} prompts "
                               f"of {PAIR_PROMPT_LEN} per text category")
        if self.k < max(self.budget, 1) and self.policy in ("ddtree", "adaptive"):
            return "k", f"got {self.k}, expected >= budget {self.budget} (the trace must hold top-budget drafts)"
        need = self.prompt_len + self.rounds + 3 * (REPLAY_DEPTH + 1)   # + the continuation's tail and one tree
        if not self.trace and need > cfgs["model"].max_seq_len:
            return "rounds", (f"prompt_len {self.prompt_len} + rounds {self.rounds} + {3 * (REPLAY_DEPTH + 1)} = "
                              f"{need} exceeds {self.model}'s max_seq_len {cfgs['model'].max_seq_len}")
        if not -1.0 <= self.row_cost < math.inf:
            return "row_cost", f"got {self.row_cost}, expected a finite number >= 0 (or < 0: from the cost model)"
        if self.check_live and (self.trace or self.drafter == "synthetic-only"):   # the kind would skip it silently
            return "check_live", (f"got true with {'a trace file' if self.trace else 'drafter synthetic-only'}: no "
                                  "target to run live; expected false, or a drafter on a target (keyed, block, pair)")
        return (_budget(self.budget) or _positive(self, "prompts", "prompt_len", "rounds", "k", "max_width", "batch",
                                                  "ctx") or _static_tree(self.policy, self.branching, REPLAY_DEPTH))


FAMILY_SHAPES = {
    "tree_build": TreeBuildShape,
    "tree_verify_mla": TreeVerifyMlaShape,
    "tree_accept": TreeAcceptShape,
    "kv_compact": KvCompactShape,
    "moe_experts": MoeExpertsShape,
}
KIND_SHAPES = {"acceptance": GenerationShape, "e2e": GenerationShape, "topology": TopologyShape,
               "replay": ReplayShape}
