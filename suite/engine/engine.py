"""generate(): batched prefill, then AR decode or speculative steps (draft -> build -> verify -> accept ->
compact -> commit) over fixed-shape device tensors; termination is checked on the host between steps.
prepare(Request) -> (Plan, EngineState) and step(plan, state, timer, kv_limit) are the public pieces that
generate() and CUDA-graph capture (graph.py) share.

A speculative step runs ONE target forward over the flattened, padded trees of the whole batch. Inside a
step nothing reads device values on the host (no .item / .tolist / nonzero / boolean indexing), except
the torch tree_build's host heap (the serving-stack path, documented), so the "cuda" path can be
captured as a CUDA graph (one per kv_limit bucket). See plans/0003-engine.md.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import time
from dataclasses import dataclass

import torch

from kdbench.model.transformer import Transformer, check_cuda_attention
from kdbench.references.model_config import get_preset, preset_names

from .records import GenerateResult, StageTimer, StepRecord
from .stages import Policy, Stages, get_stages
from .state import EngineState, Sampler

KV_BUCKET = 64  # kv_limit (keys the torch attention scans) is rounded up to this many rows


@dataclass(frozen=True)
class Request:
    """One generation: what generate() and graph.capture_step are asked for. drafter None for policy "ar"."""
    model: Transformer
    drafter: object | None
    prompts: list[list[int]]
    max_new_tokens: int
    policy: Policy
    temperature: float = 0.0
    seed: int = 0
    backend: str = "torch"     # a stage backend of the registry (suite/backends/registry.py)


@dataclass(frozen=True)
class Plan:
    """The fixed parts of one generation, derived from its Request."""
    model: Transformer
    drafter: object | None
    policy: Policy
    stages: Stages
    sampler: Sampler
    depth: int       # drafter L (0 for AR)
    rows: int        # verify rows per request: tree nodes + 1 (AR: 1)
    max_len: int     # cache rows per request


def generate(model: Transformer, drafter, prompts: list[list[int]], max_new_tokens: int, policy: Policy,
             temperature: float = 0.0, seed: int = 0, backend: str = "torch", *,
             keep_state: bool = False) -> GenerateResult:
    """Generate max_new_tokens per prompt with the target's rule (argmax at T = 0, samples at T > 0).

    drafter: a BlockDrafter or SyntheticDrafter (None for policy kind "ar"). Ragged prompts are right-padded
    in one batched prefill. Speculative results are lossless: the tokens equal AR decoding's (T = 0) or
    follow its distribution (T > 0). max_new_tokens 0 returns empty token lists and no steps.
    keep_state=True keeps the final EngineState (KV cache included) in result.state, for tests.
    Raises ValueError on bad arguments (empty prompts, tokens outside the vocabulary, a missing
    drafter, sequences beyond the model's max_seq_len, a negative temperature).
    """
    req = Request(model, drafter, prompts, max_new_tokens, policy, temperature, seed, backend)
    _validate(req)
    result = GenerateResult(tokens=[[] for _ in prompts], policy=policy.label, temperature=float(temperature),
                            drafter=getattr(drafter, "name", "") if policy.kind != "ar" else "", backend=backend)
    if max_new_tokens == 0:
        return result
    plan, state = prepare(req, validated=True)
    result.prefill_ns, result.attention = state.prefill_ns, plan.stages.attn
    while True:
        done, lengths = state.done.tolist(), state.cache.lengths.tolist()  # the between-steps host read
        if all(done):
            break
        kv_limit = bucketed_kv_limit(plan, max(lengths) + plan.rows)
        timer = StageTimer(model.device)
        tau, size = step(plan, state, timer, kv_limit)
        stage_ns = timer.finish()
        tau, size = tau.tolist(), size.tolist()
        result.steps.append(StepRecord(len(result.steps), tuple(tau), tuple(max(t - 1, 0) for t in tau),
                                       tuple(size), stage_ns))
    result.tokens = state.tokens()
    result.state = state if keep_state else None
    return result


def bucketed_kv_limit(plan: Plan, reach: int) -> int:
    """The keys a step's attention scans when its furthest row sits at cache position `reach` - 1: rounded
    up to KV_BUCKET rows (fewer distinct shapes), at most the whole cache."""
    return min(plan.max_len, KV_BUCKET * math.ceil(reach / KV_BUCKET))


def target_from_preset(name: str, seed: int, device="cpu", dtype=torch.bfloat16, reference_init: bool = False,
                       **kw) -> Transformer:
    """A random target of a named preset; reference_init=True uses the numpy reference's values (tiny
    presets). An unknown name is a ValueError listing the valid presets."""
    try:
        cfg = get_preset(name)
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(preset_names())}") from None
    if reference_init:
        return Transformer.from_reference(cfg, seed, device, dtype, **kw)
    return Transformer.random(cfg, seed, device, dtype, **kw)


def greedy_oracle(model: Transformer, prompts: list[list[int]], n_new: int, backend: str = "torch"
                  ) -> list[list[int]]:
    """prompt + the target's greedy AR continuation of n_new tokens, per prompt (the synthetic drafter's
    oracle; it lives here, not in model/, because it runs the engine)."""
    res = generate(model, None, prompts, n_new, Policy(kind="ar"), backend=backend)
    return [list(p) + list(t) for p, t in zip(prompts, res.tokens)]


# -------------------------------------------------------------------------------------------- set-up

def prepare(req: Request, validated: bool = False) -> tuple[Plan, EngineState]:
    """Validate (unless `validated`), plan (builds the CUDA extension for "cuda"), allocate and prefill: the
    state the first step starts from. Raises ValueError on bad arguments (see generate)."""
    if not validated:
        _validate(req)
    plan = _plan(req)
    state = EngineState.allocate(req.model.new_cache(len(req.prompts), plan.max_len), req.max_new_tokens,
                                 slack=2 * (plan.depth + 1), budget=req.policy.nodes(plan.depth))
    t0 = time.perf_counter_ns()
    _prefill(plan, state, req.prompts)
    state.prefill_ns = _sync_ns(req.model.device, t0)
    return plan, state


def step(plan: Plan, st: EngineState, timer, kv_limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One AR or speculative step for every request (a finished one commits nothing), state updated in place
    (fixed addresses: a CUDA graph replays it). timer: a StageTimer or anything with mark(name). Returns
    (tokens committed, tree size incl. the root) [B] int32 on the device."""
    return (_ar_step if plan.policy.kind == "ar" else _spec_step)(plan, st, timer, kv_limit)


def _validate(req: Request) -> None:
    model, drafter, prompts, max_new_tokens, policy, temperature = (
        req.model, req.drafter, req.prompts, req.max_new_tokens, req.policy, req.temperature)
    if not isinstance(policy, Policy):
        raise ValueError(f"policy must be a Policy, got {type(policy).__name__}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    V = model.cfg.vocab_size
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty (every prompt needs at least one token)")
        bad = [t for t in p if not (isinstance(t, numbers.Integral) and 0 <= t < V)]
        if bad:
            raise ValueError(f"prompt {i} has tokens outside [0, {V}): {bad[:5]}")
    if policy.kind != "ar":
        if drafter is None:
            raise ValueError(f"policy {policy.label} needs a drafter")
        policy.nodes(drafter.depth)  # raises for a static tree deeper than the drafter
    depth = drafter.depth if policy.kind != "ar" else 0
    longest = max(len(p) for p in prompts) + max_new_tokens + depth + 1
    if longest > model.cfg.max_seq_len:
        raise ValueError(f"longest prompt + max_new_tokens + depth + 1 = {longest} exceeds "
                         f"{model.cfg.name}'s max_seq_len {model.cfg.max_seq_len}")


def _plan(req: Request) -> Plan:
    model, policy = req.model, req.policy
    stages = get_stages(req.backend, policy)
    if stages.attn == "cuda":
        check_cuda_attention(model.cfg)
        if model.dtype != torch.bfloat16:   # the kernel reads bf16 caches: say so instead of timing torch
            stages = dataclasses.replace(stages, attn="torch")
    if getattr(model, "batch_invariant", False):   # such a model always runs its invariant attention
        stages = dataclasses.replace(stages, attn="invariant")
    depth = req.drafter.depth if policy.kind != "ar" else 0
    rows = policy.nodes(depth) + 1
    # a request's rows: prompt + generated (a step may overshoot max_new by depth) + one tree in flight
    max_len = max(len(p) for p in req.prompts) + req.max_new_tokens + 2 * (depth + 1) + rows
    spec_drafter = req.drafter if policy.kind != "ar" else None
    return Plan(model, spec_drafter, policy, stages, Sampler(req.temperature, req.seed, model.device), depth, rows,
                max_len)


def _sync_ns(device, t0: int) -> int:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter_ns() - t0


def _prefill(run: Plan, st: EngineState, prompts: list[list[int]]) -> None:
    """One causal forward over the right-padded prompts; the first generated token; drafter context."""
    dev, B, P = run.model.device, len(prompts), max(len(p) for p in prompts)
    tokens = torch.zeros(B, P, dtype=torch.int64)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = torch.tensor(p, dtype=torch.int64)
    tokens = tokens.to(dev)
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32, device=dev)
    taps = run.drafter.tap_layers if run.drafter is not None else ()
    out = run.model.forward(tokens, torch.arange(P, device=dev).expand(B, P), st.cache, torch.zeros_like(lens),
                            kv_limit=P, logit_rows=lens - 1, attn="torch", tap_layers=taps)
    first = run.sampler.pick(out.logits[:, 0])
    st.cache.lengths.copy_(lens)
    st.gen[:, 0] = first
    st.n_gen.fill_(1)
    st.bonus.copy_(first)
    st.done = st.n_gen >= st.max_new
    if run.drafter is not None:
        run.drafter.reset(B, run.max_len)
        run.drafter.begin(out.taps, lens)


# ---------------------------------------------------------------------------------------------- steps

def _ar_step(run: Plan, st: EngineState, timer: StageTimer, kv_limit: int):
    """One token per request: decode the bonus token, pick the next one."""
    lens = st.cache.lengths
    timer.mark("verify")
    out = run.model.forward(st.bonus[:, None], lens.to(torch.int64)[:, None], st.cache, lens,
                            kv_limit=kv_limit, attn=run.stages.attn, tap_layers=())
    timer.mark("accept")
    nxt = run.sampler.pick(out.logits[:, 0])
    timer.mark("commit")
    count = torch.where(st.done, 0, 1).to(torch.int32)
    st.advance(nxt[:, None], count, nxt)
    return count, torch.ones_like(count)


def _spec_step(run: Plan, st: EngineState, timer: StageTimer, kv_limit: int):
    """Draft -> build -> verify (one forward, whole batch) -> accept -> compact -> commit."""
    lens, L = st.cache.lengths, run.depth
    timer.mark("draft")
    draft_logits = run.drafter.draft(st.bonus, lens, kv_limit)                       # [B, L, V]
    timer.mark("build")
    tree = run.stages.tree_build(draft_logits, st.budgets, st.bonus, lens, run.rows - 1)
    timer.mark("verify")
    out = run.model.forward(tree.tokens, tree.positions, st.cache, lens, tree.anc, kv_limit=kv_limit,
                            attn=run.stages.attn, tap_layers=run.drafter.tap_layers)  # logits [B, N, V]
    timer.mark("accept")
    res = _accept(run, tree, out.logits)
    count = torch.where(st.done, 0, res.accept_len).to(torch.int32)                    # frozen: commit nothing
    timer.mark("compact")
    run.stages.kv_compact(st.cache.kv, lens, res.accepted, count)
    timer.mark("commit")
    rows = res.accepted.to(torch.int64).clamp(min=0)                                   # [B, L+1] root first
    if out.taps is not None:
        run.drafter.commit(out.taps.gather(1, rows[..., None].expand(-1, -1, out.taps.shape[-1])), count)
    committed = tree.tokens.gather(1, rows)                                            # [B, L+1]
    k = torch.arange(L + 1, device=rows.device)[None, :]
    drafts_then_bonus = torch.cat((committed[:, 1:], committed[:, :1]), dim=1)        # drafts shifted left
    new = torch.where(k == (count.to(torch.int64) - 1)[:, None], res.bonus[:, None], drafts_then_bonus)
    st.advance(new, count, res.bonus)
    return count, tree.n_nodes


def _accept(run: Plan, tree, logits: torch.Tensor):
    """The target's decision at every tree row, then the walk (greedy or sampled)."""
    args = (tree.tokens, tree.first_child, tree.next_sibling, tree.n_nodes)
    if run.sampler.greedy:
        return run.stages.tree_accept_greedy(*args, logits.argmax(dim=-1), run.depth)
    B, N = tree.tokens.shape
    return run.stages.tree_accept_sampled(*args, run.sampler.probs(logits), run.sampler.uniforms(B, N), run.depth)
