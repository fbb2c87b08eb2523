"""Shared set-up of the model-level kinds (acceptance, e2e): the target, prompts by category, the AR
baseline (cached per run), the drafter, and the per-step statistics both kinds report."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kdbench import pair
from kdbench.backends import registry
from kdbench.config import derive_seed
from kdbench.engine.engine import generate, target_from_preset
from kdbench.engine.records import GenerateResult
from kdbench.engine.stages import Policy
from kdbench.intervals import ratio_interval
from kdbench.kinds.divergence import model_logs, own_gaps, routing_flips
from kdbench.model.drafter import BlockDrafter
from kdbench.model.synthetic import SyntheticDrafter
from kdbench.prompts import token_prompts
from kdbench.results import Record
from kdbench.shapes import PAIR_MODEL, TEXT_CATEGORIES

CATEGORIES = ("random", "repetitive") + TEXT_CATEGORIES + ("mixed",)
SYNTHETIC_RANKS = 8   # the synthetic drafter places the true token at rank k with prob q (1-q)^k, k < 8


# AR logit gap below which a greedy divergence is rounding, not a bug, per model dtype: bf16 logits differ by
# up to ~0.03 between AR (B rows) and verify (B*N rows) GEMM shapes; float32 by ~1e-5; float64 must be exact.
NEAR_TIE_LOGIT = {torch.bfloat16: 0.25, torch.float16: 0.25, torch.float32: 1e-3, torch.float64: 0.0}
# MoE selection margin (k-th minus (k+1)-th biased router score) below which rounding can route a row to other
# experts in two forwards of the same tokens, per model dtype (divergence.py's routing flip)
ROUTER_EXCUSE = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-5, torch.float64: 0.0}


def model_dtype(device: str, shape) -> torch.dtype:
    """The case's dtype, or (auto) float64 for tiny presets on the CPU (exact comparisons), bf16 on the GPU,
    float32 otherwise."""
    if shape.dtype != "auto":
        return getattr(torch, shape.dtype)
    if device == "cuda":
        return torch.bfloat16
    return torch.float64 if shape.model.startswith("tiny") else torch.float32


def target(case, ctx):
    """The random target of the case's preset, built once per run (the engine picks the attention backend
    per call, so torch and cuda cases share it). Older targets are dropped: one real-width model at a time."""
    s = case.shape
    key = ("target", s.model, ctx.device, s.dtype, s.batch_invariant, s.moe)
    if key not in ctx.cache:
        for old in [k for k in ctx.cache if isinstance(k, tuple) and k[0] in ("target", "ar")]:
            del ctx.cache[old]
        dtype, kw = model_dtype(ctx.device, s), {"batch_invariant": s.batch_invariant, "moe_dispatch": s.moe}
        ctx.cache[key] = (pair.load_target(ctx.device, dtype, **kw) if s.model == PAIR_MODEL else
                          target_from_preset(s.model, derive_seed(case.scenario, s.model), device=ctx.device,
                                             dtype=dtype, **kw))
    return ctx.cache[key]


def prompt_categories(shape) -> list[str]:
    """The category of each prompt prompts() returns (mixed: `prompts` of each text category, in order)."""
    cats = TEXT_CATEGORIES if shape.category == "mixed" else (shape.category,)
    return [c for c in cats for _ in range(shape.prompts)]


def prompts(case, vocab: int) -> list[list[int]]:
    """`prompts` prompts of `prompt_len` tokens. random: uniform tokens; repetitive: a short random motif
    repeated (the kind of context where drafters do best); code / prose / structured / mixed: the trained
    pair's held-out text prompts (kdbench/data/prompts_*.jsonl), the same ones in every arm."""
    s = case.shape
    if s.category in TEXT_CATEGORIES + ("mixed",):
        cats = TEXT_CATEGORIES if s.category == "mixed" else (s.category,)
        return [p for c in cats for p in token_prompts(c, s.prompts, s.prompt_len)]
    rng = np.random.default_rng(derive_seed(case.scenario, "prompts", s.category, s.prompt_len, s.prompts))
    out = []
    for _ in range(s.prompts):
        if s.category == "repetitive":
            motif = rng.integers(0, vocab, size=int(rng.integers(3, 8)))
            out.append([int(t) for t in np.resize(motif, s.prompt_len)])
        else:
            out.append([int(t) for t in rng.integers(0, vocab, size=s.prompt_len)])
    return out


def ar_key(case, backend: str) -> tuple:
    """What an AR run of a case depends on (the target is cached per model / dtype / mode / moe, and a new
    target drops every "ar" key); sampled AR runs also depend on the seed."""
    s = case.shape
    return (s.model, s.dtype, s.batch_invariant, s.moe, backend, s.category, s.prompt_len, s.prompts,
            s.max_new_tokens, s.batch, s.temperature, case.seed if s.temperature > 0 else None)


def ar_baseline(case, ctx, model, backend: str, batch_prompts) -> GenerateResult:
    key = ("ar",) + ar_key(case, backend)
    if key not in ctx.cache:
        ctx.cache[key] = run_batched(model, None, batch_prompts, case.shape, Policy(kind="ar"), backend, case.seed)
    return ctx.cache[key]


def run_batched(model, make_drafter, all_prompts, s, policy: Policy, backend: str, seed: int, *,
                run=None) -> list[GenerateResult]:
    """run (default generate(); or a function with its arguments: engine/graph_run.generate_graphed) over the prompts
    in batches of s.batch (one GenerateResult per batch); make_drafter(first, last) builds the drafter for
    prompts[first:last] (None for AR)."""
    return [_run_chunk(model, make_drafter, all_prompts, i, s, policy, backend, seed, run or generate)
            for i in range(0, len(all_prompts), s.batch)]


def _run_chunk(model, make_drafter, all_prompts, first: int, s, policy: Policy, backend: str, seed: int, run
               ) -> GenerateResult:
    chunk = all_prompts[first:first + s.batch]
    drafter = make_drafter(first, first + len(chunk)) if make_drafter else None
    return run(model, drafter, chunk, s.max_new_tokens, policy, s.temperature, seed + first, backend)


def batch_rerun(model, make_drafter, all_prompts, s, policy: Policy, backend: str, seed: int):
    """A function i -> (row of prompt i in its batch, () -> AR's eager run of that batch, () -> the policy's):
    what losslessness() re-runs under a logit tap to measure a divergence on the arms' own forwards."""
    def at(i: int):
        first = i // s.batch * s.batch
        return (i - first,
                lambda: _run_chunk(model, None, all_prompts, first, s, Policy(kind="ar"), backend, seed, generate),
                lambda: _run_chunk(model, make_drafter, all_prompts, first, s, policy, backend, seed, generate))
    at.memo = {}    # divergence -> measured gaps: an e2e row's graph-mode and eager verdicts often share one
    return at


def policy_of(s) -> Policy:
    return Policy(kind=s.policy, budget=s.budget, max_width=s.max_width if s.policy == "ddtree_width_capped" else 0,
                  branching=tuple(s.branching) if s.policy == "static_kary" else ())


def drafter_factory(case, ctx, model, all_prompts, ar: list[GenerateResult]):
    """A function (first, last) -> the drafter for prompts[first:last]. The synthetic drafter's oracle is
    the prompt + the target's AR continuation; the block drafter is random (untrained) and shared."""
    s = case.shape
    if s.drafter == "trained":
        trained = pair.load_drafter(model)
        return lambda first, last: trained
    if s.drafter == "block":
        block = BlockDrafter.random(model, derive_seed(case.scenario, "drafter"), block_size=s.draft_len + 1)
        return lambda first, last: block
    tokens = [t for r in ar for t in r.tokens]
    oracle = [p + t for p, t in zip(all_prompts, tokens)]
    q = s.quality
    ranks = tuple(q * (1 - q) ** k for k in range(SYNTHETIC_RANKS)) if q < 1 else (1.0,)
    return lambda first, last: SyntheticDrafter(
        oracle[first:last], model.cfg.vocab_size, depth=s.draft_len, quality=max(q, 1e-6), rank_probs=ranks,
        seed=case.seed + first, device=ctx.device)


@dataclass
class StepStats:
    tau: float                    # mean tokens committed per (request, step), counting the bonus token
    per_depth: list[float]        # P(accepted depth >= d), d = 1..L, over (request, step) pairs
    hist: dict[int, int]          # accept length (tau of one step) -> count
    steps: int
    mean_tree: float


def step_stats(results: list[GenerateResult], depth: int) -> StepStats:
    taus = np.array([t for r in results for st in r.steps for t in st.tau if t > 0])
    sizes = [z for r in results for st in r.steps for z, t in zip(st.tree_size, st.tau) if t > 0]
    if taus.size == 0:
        return StepStats(float("nan"), [], {}, 0, float("nan"))
    per_depth = [float((taus - 1 >= d).mean()) for d in range(1, depth + 1)]
    values, counts = np.unique(taus, return_counts=True)
    return StepStats(float(taus.mean()), per_depth, {int(v): int(c) for v, c in zip(values, counts)},
                     int(taus.size), float(np.mean(sizes)))


def per_prompt_steps(results: list[GenerateResult]) -> list[tuple[float, int]]:
    """(tokens committed, speculative steps) of each prompt (prompt order, batches concatenated); a finished
    request's later steps (tau 0) do not count."""
    out = []
    for r in results:
        for b in range(len(r.tokens)):
            taus = [st.tau[b] for st in r.steps if st.tau[b] > 0]
            out.append((float(sum(taus)), len(taus)))
    return out


def _taus(steps: list[tuple[float, int]]) -> list[float]:
    """tokens / steps of each (tokens, steps) pair; NaN for a prompt without a speculative step."""
    return [y / x if x else float("nan") for y, x in steps]


def per_prompt_tau(results: list[GenerateResult]) -> list[float]:
    """Mean tau of each prompt over its steps (prompt order, batches concatenated): the paired statistic."""
    return _taus(per_prompt_steps(results))


def tau_uncertainty(results: list[GenerateResult]) -> dict:
    """Per-prompt tau and steps, and the pooled tau's 95 % interval over prompts (intervals.py)."""
    steps = per_prompt_steps(results)
    iv = ratio_interval([y for y, _ in steps], [x for _, x in steps])
    return {"tau_per_prompt": _taus(steps),
            "tau_steps_per_prompt": [x for _, x in steps], "tau_prompts": iv.n,
            "tau_ci95": None if iv.lo is None else [iv.lo, iv.hi]}


def by_category(results: list[GenerateResult], cats: list[str]) -> dict[str, float]:
    """The pooled tau (committed tokens / steps) of each category's prompts, as the row's tau is pooled."""
    steps, out = per_prompt_steps(results), {}
    for c in dict.fromkeys(cats):
        y = sum(yi for (yi, _), k in zip(steps, cats) if k == c)
        x = sum(xi for (_, xi), k in zip(steps, cats) if k == c)
        out[c] = y / x if x else float("nan")
    return out


def first_divergence(ar: list[GenerateResult], spec: list[GenerateResult]) -> tuple[int, int] | None:
    """(prompt, position) of the first token where speculative output differs from AR; None if none."""
    ar_t = [t for r in ar for t in r.tokens]
    sp_t = [t for r in spec for t in r.tokens]
    for i, (a, b) in enumerate(zip(ar_t, sp_t)):
        if a != b:
            return i, next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return None


def losslessness(model, all_prompts, ar, spec, rerun=None) -> tuple[str, bool]:
    """(verdict text, is_bug). With `rerun` (batch_rerun's function) a divergence is measured on the arms' own
    forwards (divergence.py): the shift = AR's gap logit[a] - logit[b] minus the speculative arm's, at the
    divergent prediction; below NEAR_TIE_LOGIT of the model dtype it is rounding between forward shapes (a
    near-tie, not a bug); above it, a routing flip (not a bug) where the row went to other experts in the two
    forwards at a layer whose selection margin is below ROUTER_EXCUSE, else a MISMATCH. Without it (or when the
    re-run cannot measure the divergence: _rerun_gaps says why) the AR logit gap is recomputed by one prefill of
    prompt + AR tokens, whose own rounding is part of the figure. A batch-invariant target has no excuse in any
    dtype: AR and verify compute every row bit for bit alike."""
    where = first_divergence(ar, spec)
    if where is None:
        return "yes", False
    i, pos = where
    ar_tok = [t for r in ar for t in r.tokens][i]
    sp_tok = [t for r in spec for t in r.tokens][i]
    excuse = _excuse(model, NEAR_TIE_LOGIT)
    at = f"prompt {i}, position {pos}"
    note = ""
    if rerun is not None:
        gaps, note = _rerun_gaps(model, all_prompts, rerun, i, pos, ar_tok, sp_tok[pos])
        if gaps is not None:
            return _own_verdict(model, at, *gaps, excuse)
    gap, margin = logit_gap(model, all_prompts[i] + ar_tok[:pos], ar_tok[pos], sp_tok[pos])
    kind = "near-tie" if abs(gap) < excuse else "MISMATCH"
    why = f"; router margin {margin[0]:.3g} at layer {margin[1]}" if margin else ""
    return f"no: {kind} ({at}, AR logit gap {gap:.4g} by prefill{why}{note})", kind == "MISMATCH"


def _excuse(model, table: dict) -> float:
    """The model dtype's entry of an excuse table; none for a batch-invariant target (it computes AR and verify
    rows bit for bit alike)."""
    return 0.0 if getattr(model, "batch_invariant", False) else table.get(model.dtype, 0.0)


def _rerun_gaps(model, all_prompts, rerun, i: int, pos: int, ar_tok: list[int], b: int):
    """((AR's own gap, the speculative one), "") from the eager re-run of prompt i's batch, or (None, why not).
    Memoized in rerun.memo where the function has one (batch_rerun's)."""
    memo = getattr(rerun, "memo", {})
    key = (i, pos, ar_tok[pos], b)
    if key not in memo:
        row, run_ar, run_spec = rerun(i)
        try:
            memo[key] = own_gaps(model, all_prompts[i], row, pos, ar_tok, ar_tok[pos], b, run_ar, run_spec)
        except RuntimeError as exc:                      # out of memory, say: the prefill fallback still answers
            memo[key] = (None, None, f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    g_ar, g_sp, same = memo[key]
    if isinstance(same, str):
        return None, f"; the eager re-run {same}"
    if not same:
        return None, "; the eager re-run did not reproduce it"
    if g_ar is None or g_sp is None:
        return None, "; the eager re-run found no row on the committed path"
    if g_ar.gap < 0 or g_sp.gap > 0:   # the deciding rows rank a over b (AR) and b over a (speculative)
        return None, f"; the re-run's rows do not pick the arms' tokens (gaps {g_ar.gap:+.3g}, {g_sp.gap:+.3g})"
    return (g_ar, g_sp), ""


def _own_verdict(model, at: str, g_ar, g_sp, excuse: float) -> tuple[str, bool]:
    """near-tie / routing flip / MISMATCH from the two arms' own gaps (divergence.py)."""
    shift = g_ar.gap - g_sp.gap
    flips = routing_flips(g_ar, g_sp)
    router = _excuse(model, ROUTER_EXCUSE)
    kind = ("near-tie" if abs(shift) < excuse else
            "routing flip" if flips and min(m for _, m in flips) < router else "MISMATCH")
    flip = "".join(f"; other experts at layer {layer} (margin {m:.3g} vs {router:g})" for layer, m in flips)
    same = "; same experts at every MoE layer" if g_ar.experts and not flips else ""
    text = (f"no: {kind} ({at}, own logit gaps: AR {g_ar.gap:+.4g}, speculative {g_sp.gap:+.4g}, shift "
            f"{shift:.4g} vs {excuse:g}{flip}{same})")
    return text, kind == "MISMATCH"


def logit_gap(model, prefix: list[int], a: int, b: int) -> tuple[float, tuple[float, int] | None]:
    """(logit[a] - logit[b] after `prefix`, the smallest MoE selection margin of that prediction's row over the
    layers with its layer, or None where the model logs none: no MoE layers, or a model without margin_log such as
    the sharded one): a margin near 0 means rounding could have chosen other experts there, which a logit gap
    cannot show (the verdict says it; it does not excuse)."""
    with model_logs(model, ("margin_log",)) as logs:
        logits = next_logits(model, prefix).double()
    margins = [(float(m[-1]), layer) for layer, m in logs.get("margin_log", [])]
    return float(logits[a] - logits[b]), min(margins) if margins else None


def next_logits(model, prefix: list[int]) -> torch.Tensor:
    """[V] logits after `prefix`, from one causal prefill on the torch attention path."""
    dev, n = model.device, len(prefix)
    tokens = torch.tensor([prefix], dtype=torch.int64, device=dev)
    cache = model.new_cache(1, n + 1)
    zero = torch.zeros(1, dtype=torch.int32, device=dev)
    out = model.forward(tokens, torch.arange(n, device=dev)[None], cache, zero, kv_limit=n,
                        logit_rows=torch.full((1,), n - 1, dtype=torch.int32, device=dev), attn="torch")
    return out.logits[0, 0]


def unavailable(case, ctx, backend: str) -> Record | None:
    """A skipped record when the backend cannot run here (checked before any model is built), else None."""
    ok, why = registry.available(backend, ctx.device)
    if ok:
        return None
    rec = base_record(case, ctx, backend)
    rec.status, rec.reason = "skipped", why
    return rec


def base_record(case, ctx, backend: str) -> Record:
    dtype = str(model_dtype(ctx.device, case.shape)).replace("torch.", "")
    rec = ctx.record(case, backend, dtype=dtype)
    rec.extra["batch_invariant"] = bool(case.shape.batch_invariant)
    rec.extra["moe"] = case.shape.moe
    return rec


def note_attention(rec: Record, results: list[GenerateResult]) -> None:
    """Record the attention that ran; a cuda row whose model is not bf16 ran torch attention and says so."""
    ran = sorted({r.attention for r in results if r.attention})
    rec.extra["attention"] = ",".join(ran)
    if rec.backend == "cuda" and any(a != "cuda" for a in ran):
        why = ("cuda stages with the batch-invariant attention (batch_invariant: true)" if "invariant" in ran else
               f"cuda stages with torch attention: the model is {rec.dtype} and the tree_verify_mla kernel reads "
               "bf16 (dtype: bfloat16 times the kernel)")
        rec.reason = f"{rec.reason}; {why}" if rec.reason else why
