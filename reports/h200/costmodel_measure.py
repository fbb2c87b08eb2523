"""One-call H200 check of the verify-cost model (plans/0008-cost-model.md): forward time and router experts of
kimi-k2-slice-2 and slice-4 at batch 1/8/32 and chain trees of budget 0 (AR)/16/64/256 at past 1024 (and slice-2
at past 8192, 65 rows: the context term), then the
model's predictions beside them: fitted to these cells (in-sample and leave-one-out) and, out of sample, the
model fitted to the 2026-12-01 slice-2 table of device/h200_facts.md. About 2 minutes on one H200.

Usage: python3 reports/h200/costmodel_measure.py OUT_DIR [--models a,b] [--deadline-s 170]
       python3 reports/h200/costmodel_measure.py OUT_DIR --from-jsonl MEASURED.jsonl   (re-fit only, CPU)
Writes OUT_DIR/costmodel_measurements.jsonl (costfit.Measurement per line; `kdbench replay --measured` and
`costfit.load` read it), OUT_DIR/costmodel_validation.md and .json.
"""
import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from kdbench import costfit, costmeasure
from kdbench.backends import cuda_build


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--models", default="kimi-k2-slice-2,kimi-k2-slice-4")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rows", default="1,17,65,257")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("--deadline-s", type=float, default=170.0)
    ap.add_argument("--step-budget", type=int, default=64,
                    help="also each batch's live step time outside verify at this DDTree budget (0: skip)")
    ap.add_argument("--long-ctx", type=int, default=8192,
                    help="also the first model at this context, batch 1/8/32 x 65 rows (0: skip)")
    ap.add_argument("--from-jsonl", help="skip measuring: re-fit and report these committed cells "
                                         "(cuda attention assumed, as measured)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.from_jsonl:
        report(costfit.load(a.from_jsonl), "cuda", out)
        return
    t0 = time.time()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reason = cuda_build.unavailable_reason() if device == "cuda" else "no GPU"
    attn = "cuda" if reason is None else "torch"
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"device {device} ({gpu}), attention {attn} ({reason or 'kdbench_cuda built'}), {time.time() - t0:.0f} s")
    ms = []
    for name in a.models.split(","):
        if time.time() - t0 > a.deadline_s:
            print(f"deadline: {name} skipped")
            continue
        ms += costmeasure.run_grid([name], [int(x) for x in a.batches.split(",")],
                                   [int(x) for x in a.rows.split(",")], a.ctx, device=device, attn=attn,
                                   repeat=a.repeat, step_budget=a.step_budget)
        if a.long_ctx and name == a.models.split(",")[0]:
            ms += costmeasure.run_grid([name], [int(x) for x in a.batches.split(",")], [65], a.long_ctx,
                                       device=device, attn=attn, repeat=a.repeat)
        ms = [m if " on " in m.source else dataclasses.replace(m, source=f"{m.source} on {gpu}") for m in ms]
        costfit.dump(out / "costmodel_measurements.jsonl", ms)     # partial results survive a kill
        print(f"{name} done at {time.time() - t0:.0f} s")
    report(ms, attn, out)


def report(ms, attn: str, out: Path) -> None:
    attn_eff = costfit.KDBENCH_ATTN_EFF if attn == "cuda" else 0.12   # torch eager absorbed: ~7-16 % (facts)
    sections, summary, all_ins, all_loo = [], {}, [], []
    for model in sorted({m.model for m in ms}):
        cells = [m for m in ms if m.model == model]
        curve = costfit.expert_curve(cells)
        eff = costfit.fit(cells, curve, attn_eff)
        ins, loo = costfit.validate(cells, eff, curve), costfit.leave_one_out(cells, curve, attn_eff)
        all_ins, all_loo = all_ins + ins, all_loo + loo
        summary[model] = {"efficiency": eff.__dict__, "in_sample": costfit.summary(ins),
                          "leave_one_out": costfit.summary(loo)}
        steps = costfit.outside_verify(ms, model)
        step_text = [f"- batch {m.batch}, DDTree {m.rows - 1}: {m.seconds * 1e3:.2f} ms outside verify ({m.source})"
                     for m in steps]
        sections += [f"## {model}: fitted to its {len(costfit.forwards(cells))} forwards", "",
                     f"gemm {eff.gemm:.3f}, moe {eff.moe:.3f}, attn {eff.attn:.2f} (fixed), "
                     f"device overhead {eff.overhead_s * 1e3:.3f} ms, host {eff.host_s * 1e3:.3f} ms", "", "In sample:", "", costfit.markdown(ins), "",
                     "Leave one out:", "", costfit.markdown(loo), ""] + (
                     ["Live step outside verify (sets the drafter's fixed time "
                      f"{eff.draft_overhead_s * 1e3:.2f} ms + {eff.draft_request_s * 1e6:.0f} us per request):", ""] + step_text + [""] if steps else [])
    summary["all_models"] = {"in_sample": costfit.summary(all_ins), "leave_one_out": costfit.summary(all_loo)}
    sections = [f"All {len(all_loo)} cells, each model fitted to its own cells: in sample median |error| "
                f"{summary['all_models']['in_sample']['median_abs_error'] * 100:.1f} %, worst "
                f"{summary['all_models']['in_sample']['max_abs_error'] * 100:.1f} %; leave-one-out median "
                f"{summary['all_models']['leave_one_out']['median_abs_error'] * 100:.1f} %, worst "
                f"{summary['all_models']['leave_one_out']['max_abs_error'] * 100:.1f} %.", ""] + sections
    slices = [m for m in ms if m.model.startswith("kimi-k2-slice-")]     # one family: per-layer time separated
    both = costfit.fit(slices, costfit.expert_curve(slices), attn_eff) if len({m.model for m in slices}) > 1 else None
    if both:
        per_model = [c for model in sorted({m.model for m in slices})
                     for c in costfit.validate([m for m in ms if m.model == model], both,
                                               costfit.expert_curve([m for m in slices if m.model == model]))]
        summary["joint"] = {"efficiency": both.__dict__, "in_sample": costfit.summary(per_model)}
        jl = [c for i, m in enumerate(costfit.forwards(slices))      # each slice cell by a joint fit of the others
              for c in costfit.validate([m], costfit.fit([x for j, x in enumerate(costfit.forwards(slices)) if j != i],
                                                         costfit.expert_curve(slices), attn_eff),
                                        costfit.expert_curve([x for x in slices if x.model == m.model]))]
        summary["joint"]["leave_one_out"] = costfit.summary(jl)
        sections += ["## Both slices, one fit (per-layer time separated)", "",
                     f"gemm {both.gemm:.3f}, moe {both.moe:.3f}, device {both.overhead_s * 1e3:.3f} ms + "
                     f"{both.layer_s * 1e3:.3f} ms/layer, host {both.host_s * 1e3:.3f} ms + "
                     f"{both.host_layer_s * 1e3:.3f} ms per MoE layer. In sample median "
                     f"{summary['joint']['in_sample']['median_abs_error'] * 100:.1f} %, worst "
                     f"{summary['joint']['in_sample']['max_abs_error'] * 100:.1f} %; leave-one-out median "
                     f"{summary['joint']['leave_one_out']['median_abs_error'] * 100:.1f} %, worst "
                     f"{summary['joint']['leave_one_out']['max_abs_error'] * 100:.1f} %.", "",
                     "In sample:", "", costfit.markdown(per_model), "", "Leave one out:", "", costfit.markdown(jl), ""]
    facts = costfit.fit(list(costfit.H200_FACTS), costfit.expert_curve(costfit.H200_FACTS))
    s2 = [m for m in ms if m.model == "kimi-k2-slice-2"]
    if attn == "cuda" and s2:
        old = costfit.validate(s2, facts, costfit.expert_curve(s2))
        summary["facts_fit_out_of_sample"] = costfit.summary(old)
        sections += ["## Out of sample: the model fitted to h200_facts (slice-2, 2026-12-01)", "",
                     costfit.markdown(old), ""]
    (out / "costmodel_validation.md").write_text("# Cost model vs measurement\n\n" + "\n".join(sections))
    (out / "costmodel_validation.json").write_text(json.dumps(summary, indent=1, default=float))
    print(json.dumps(summary, indent=1, default=float))


if __name__ == "__main__":
    main()
