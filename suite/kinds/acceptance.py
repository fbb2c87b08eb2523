"""acceptance kind: tau (tokens committed per verify step, counting the bonus token), per-depth acceptance,
the accept-length histogram, and losslessness per prompt (greedy output equals AR, first divergence)."""
from __future__ import annotations

from collections.abc import Iterator

from kdbench.kinds import generation as gen
from kdbench.results import Record


def run(case, ctx) -> Iterator[Record]:
    s = case.shape
    for backend in case.backends:
        skipped = gen.unavailable(case, ctx, backend)
        if skipped is not None:   # the other backends still run
            yield skipped
            continue
        model = gen.target(case, ctx)
        all_prompts = gen.prompts(case, model.cfg.vocab_size)
        ar = gen.ar_baseline(case, ctx, model, backend, all_prompts)
        make = gen.drafter_factory(case, ctx, model, all_prompts, ar)
        policy = gen.policy_of(s)
        spec = gen.run_batched(model, make, all_prompts, s, policy, backend, case.seed)
        stats = gen.step_stats(spec, s.draft_len)
        rec = gen.base_record(case, ctx, backend)
        rec.policy = policy.label
        rec.tau = stats.tau
        rec.extra.update({"per_depth_accept": stats.per_depth, "accept_len_hist": stats.hist,
                          "steps": stats.steps, "mean_tree_size": stats.mean_tree, "policy": policy.label,
                          "drafter": make(0, 1).name, "tau_convention": "tau counts the bonus token",
                          "budget": s.budget})
        rec.extra.update(gen.tau_uncertainty(spec))
        rec.extra["tau_per_category"] = gen.by_category(spec, gen.prompt_categories(s))
        if s.temperature == 0:
            rerun = gen.batch_rerun(model, make, all_prompts, s, policy, backend, case.seed)
            rec.lossless, bug = gen.losslessness(model, all_prompts, ar, spec, rerun)
            rec.status = "fail" if bug else ("pass" if rec.lossless == "yes" else "info")
            if rec.lossless != "yes":
                rec.reason = f"greedy speculative output differs from AR: {rec.lossless}"
        else:
            rec.status = "info"
            rec.reason = "T > 0: losslessness is a distribution property (tests/test_engine_sampled.py)"
        gen.note_attention(rec, spec)
        yield rec
