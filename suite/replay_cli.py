"""`kdbench trace` (record or convert a trace) and `kdbench replay` (tau of tree policies over a trace, and
the best-budget findings); plans/0009-traces-replay.md."""
from __future__ import annotations

import json
import types
from pathlib import Path

from kdbench.errors import UserError

POLICY_HELP = ("policy kinds to replay, comma-separated: chain, ddtree, ddtree_width_capped[:W], "
               "static_kary:4x2x1, adaptive[:ROW_COST] (without a row cost the findings take it from the cost model)")


def add_commands(sub) -> None:
    t = sub.add_parser("trace", help="record a greedy acceptance trace (KDTR), or convert one from JSONL")
    t.add_argument("--out", required=True, help="trace file to write (.kdtr)")
    t.add_argument("--from-jsonl", metavar="FILE", help="convert per-round top-K lists (plans/0009 §JSONL)")
    t.add_argument("--model", default="tiny", help="target preset")
    t.add_argument("--drafter", default="keyed", choices=["keyed", "block", "pair", "synthetic-only"],
                   help="keyed: the position-keyed synthetic drafter on the target's continuation; block: the "
                        "block drafter (random weights); pair: the trained pair (kdbench.pair; --model "
                        "is kdbench-pair); synthetic-only: no target, random continuations")
    t.add_argument("--quality", type=float, default=0.8, help="synthetic drafters: mass on the true token")
    t.add_argument("--prompts", type=int, default=8)
    t.add_argument("--prompt-len", type=int, default=32)
    t.add_argument("--category", default="random",
                   choices=["random", "repetitive", "code", "prose", "structured", "mixed"],
                   help="prompt kind; code / prose / structured / mixed (--prompts of each): the trained pair's "
                        "held-out text prompts (--drafter pair)")
    t.add_argument("--rounds", type=int, default=63, help="rounds per prompt (replays up to rounds + 1 tokens)")
    t.add_argument("--k", type=int, default=256, help="top-K kept per depth (the largest budget replayed)")
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--categories", default="", help="synthetic-only: comma-separated qualities, one category "
                                                     "each (e.g. 0.6,0.8,0.9); default one at --quality")
    t.set_defaults(func=_trace)
    r = sub.add_parser("replay", help="replay tree policies over a trace: tau per round, prompt, category")
    r.add_argument("trace", help="a .kdtr trace")
    r.add_argument("--policies", default="chain,ddtree,ddtree_width_capped:4,adaptive", help=POLICY_HELP)
    r.add_argument("--budgets", default="4,8,16,32,64,128,256")
    r.add_argument("--max-new", type=int, help="tokens per prompt (default: all the trace covers)")
    r.add_argument("--out", help="directory for replay.json (and the findings with --findings)")
    r.add_argument("--findings", action="store_true", help="also the best budget per batch (cost model, modeled)")
    r.add_argument("--measured", metavar="JSONL", help="forward measurements for the cost model "
                                                        "(reports/h200/costmodel_measure.py; default the shipped fit, "
                                                        "suite/data/cost_fit_h200.json)")
    r.add_argument("--ctx", type=int, default=1024, help="committed context for the modeled step times")
    r.set_defaults(func=_replay)


def parse_policies(text: str) -> list[dict]:
    """'ddtree,ddtree_width_capped:4,static_kary:4x2,adaptive:0.01' -> Policy keyword dicts (no budget)."""
    out = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        kind, _, arg = item.partition(":")
        try:
            if kind == "ddtree_width_capped":
                out.append({"kind": kind, "max_width": int(arg or 4)})
            elif kind == "static_kary":
                out.append({"kind": kind, "branching": tuple(int(x) for x in arg.split("x"))})
            elif kind == "adaptive":
                out.append({"kind": kind, **({"row_cost": float(arg)} if arg else {})})
            elif kind in ("chain", "ddtree") and not arg:
                out.append({"kind": kind})
            else:
                raise ValueError
        except ValueError:
            raise UserError(f"--policies: bad item {item!r}; {POLICY_HELP}") from None
    return out


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag}: got {text!r}, expected comma-separated integers") from None


def _trace(args) -> int:
    from kdbench import trace as tr
    if args.from_jsonl:
        try:
            t = tr.from_jsonl(args.from_jsonl)
        except (OSError, ValueError, KeyError) as exc:
            raise UserError(f"{args.from_jsonl}: {exc}") from None
    elif args.drafter == "synthetic-only":
        t = _synthetic(args)
    else:
        t = _record(args)
    tr.save(args.out, t)
    print(f"trace: {args.out} ({t.n_prompts} prompts x {t.rounds} rounds, L {t.depth}, top-{t.k}; "
          f"{t.meta.get('drafter')})")
    return 0


def _synthetic(args):
    from kdbench import trace as tr
    from kdbench.kinds.replay import ranks
    try:
        qs = [float(q) for q in args.categories.split(",")] if args.categories else [args.quality]
    except ValueError:
        raise UserError(f"--categories: got {args.categories!r}, expected comma-separated qualities") from None
    if any(not 0 < q <= 1 for q in qs):
        raise UserError(f"--categories/--quality: got {qs}, expected qualities in (0, 1]")
    return tr.concat([tr.synthetic(args.prompts, args.rounds, args.k, quality=q, rank_probs=ranks(q),
                                   seed=args.seed + i, category=f"q={q:g}", device=args.device)
                      for i, q in enumerate(qs)])


def _record(args):
    from kdbench.kinds.replay import make_trace
    from kdbench.shapes import ReplayShape
    model = "kdbench-pair" if args.drafter == "pair" else args.model
    shape = ReplayShape(model=model, drafter=args.drafter, quality=args.quality, prompts=args.prompts,
                        prompt_len=args.prompt_len, category=args.category, rounds=args.rounds, k=args.k,
                        budget=min(args.k, 1024))
    bad = shape.validate()
    if bad:
        raise UserError(f"--{bad[0].replace('_', '-')}: {bad[1]}")
    return make_trace(shape, f"trace-{args.seed}", args.device, batch=args.batch, seed=args.seed)[0]


def _default_row_cost(ctx: int, depth: int) -> tuple[float, str]:
    """(row cost of kimi-k2-slice-2 at batch 1 from the shipped fit, the fit's provenance)."""
    from kdbench import bestbudget as bb
    from kdbench import costfit
    from kdbench.references.model_config import get_preset
    eff, curve, source = costfit.shipped_setting("kimi-k2-slice-2")
    cs = bb.CostSetting(get_preset("kimi-k2-slice-2"), ctx, eff, curve)
    return bb.row_cost(cs, 1, depth), source


def _replay(args) -> int:
    from kdbench import costfit, replay_report
    from kdbench import replay as rp
    from kdbench import trace as tr
    from kdbench.engine.stages import Policy
    if not Path(args.trace).is_file():
        raise UserError(f"{args.trace}: no such trace file")
    t = tr.load(args.trace)
    kinds, budgets = parse_policies(args.policies), _ints(args.budgets, "--budgets")
    rows = []
    for spec in kinds:
        if spec["kind"] == "adaptive" and "row_cost" not in spec:
            cost, source = _default_row_cost(args.ctx, t.depth)
            spec = {**spec, "row_cost": cost}
            print(f"adaptive: row_cost {cost:.4g} (cost model: kimi-k2-slice-2, batch 1, {source})")
        for b in budgets:
            try:
                res = rp.replay(t, Policy(**spec, budget=b), args.max_new)
            except ValueError as exc:
                raise UserError(f"{args.trace}: {exc}") from None
            rows.append({"policy": res.policy, "tau": res.mean_tau, "rows": res.mean_nodes,
                         "per_category": res.per_category(), "per_prompt": res.per_prompt(),
                         "per_round": [list(p.tau) for p in res.prompts]})
            cats = ", ".join(f"{c} {v:.2f}" for c, v in sorted(res.per_category().items()))
            print(f"{res.policy:36s} tau {res.mean_tau:6.3f}  rows {res.mean_nodes:7.1f}  ({cats})")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "replay.json").write_text(json.dumps({"trace": t.meta, "replays": rows}, indent=1))
        if args.findings:
            ms = costfit.load(args.measured) if args.measured else None
            replay_report.findings(t, out, ms, args.ctx, kinds=parse_policies(args.policies), budgets=budgets,
                                   source=args.measured or "")
            print(f"findings: {out / 'findings.html'}")
    return 0
