"""Why live tau at batch 1 fell below replay at DDTree budgets 512 / 1024 on the H200 (2026-12-01 s3 call A:
2.29 vs replayed 3.12 / 3.36, the same with both tree_build versions; equal on the CPU in float32). For the
trained pair at batch 1 (and 8), per stage backend (cuda, torch) and budget (256, 512, 1024): are the live tokens
AR's (lossless)? does the per-round tau equal a replay of a trace recorded at the same batch, and where do they
part? and, on every cuda step, does the kernel's tree hold the same root-to-node token paths as the host build
(torch_ops.tree_build) on the same draft logits? Usage: python3 reports/h200/live_diag.py OUT_DIR"""
import dataclasses
import json
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import replay_live_check as lc  # noqa: E402  (its setup(): the same model, prompts and drafter)

from kdbench import replay as rp  # noqa: E402
from kdbench import trace as tr  # noqa: E402
from kdbench.backends import torch_ops  # noqa: E402
from kdbench.engine import engine  # noqa: E402
from kdbench.engine.engine import generate  # noqa: E402
from kdbench.engine.stages import Policy  # noqa: E402

ROUNDS = 47


def paths(tree, b: int) -> set:
    """Request b's nodes as root-to-node token tuples (row order and ties aside)."""
    tok, par, n = tree.tokens[b].tolist(), tree.parents[b].tolist(), int(tree.n_nodes[b])
    memo = {0: ()}
    for i in range(1, n):
        memo[i] = memo[par[i]] + (tok[i],)
    return set(memo.values())


def compare_builds(log: list):
    """Wraps engine.get_stages: every cuda tree_build is compared with the host build on the same inputs."""
    real = engine.get_stages

    def get(backend, policy):
        st = real(backend, policy)
        if backend != "cuda" or policy.kind != "ddtree":
            return st

        def build(logits, budgets, roots, past, max_budget):
            got = st.tree_build(logits, budgets, roots, past, max_budget)
            want = torch_ops.tree_build(logits, budgets, roots, past, max_budget, policy.build_one())
            for b in range(logits.shape[0]):
                pg, pw = paths(got, b), paths(want, b)
                log.append({"max_budget": max_budget, "b": b, "nodes": len(pg), "only_kernel": len(pg - pw),
                            "only_host": len(pw - pg), "top_tok_equal": bool(torch.equal(got.top_tok[b], want.top_tok[b]))})
            return got
        return dataclasses.replace(st, tree_build=build)
    engine.get_stages = get


def first_diff(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), -1 if len(a) == len(b) else min(len(a), len(b)))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    a = types.SimpleNamespace(model="kdbench-pair", batches=[8], rounds=ROUNDS, prompt_len=128, quality=0.8,
                              invariant=False, b1_prompts=1)
    cuda = torch.cuda.is_available()             # the CPU run (torch backend only) checks this script
    model, drafter_for, prompts, _ = lc.setup(a, "cuda" if cuda else "cpu", "cuda" if cuda else "torch")
    builds, rows = [], []
    compare_builds(builds)
    for b, budgets in ((1, (256, 512, 1024)), (8, (1024,))):
        trace = tr.record(model, prompts[:b], ROUNDS, 1024, drafter_for, batch=b, backend="cuda" if cuda else "torch")
        for backend in ("cuda", "torch") if cuda else ("torch",):
            ar = generate(model, None, prompts[:b], ROUNDS + 1, Policy("ar"), backend=backend).tokens
            for budget in budgets:
                start = len(builds)
                live = generate(model, drafter_for(0, b), prompts[:b], ROUNDS + 1, Policy("ddtree", budget),
                                backend=backend)
                got = rp.live_taus(live)
                want = [list(x.tau) for x in rp.replay(trace, Policy("ddtree", budget)).prompts]
                mism = [x for x in builds[start:] if x["only_kernel"] or x["only_host"]]
                rows.append({"batch": b, "backend": backend, "budget": budget, "lossless": live.tokens == ar,
                             "tau_live": live.mean_tau, "taus_live": got, "taus_replay": want,
                             "first_diff_round": [first_diff(x, y) for x, y in zip(got, want)],
                             "builds_compared": len(builds) - start, "builds_differing": len(mism),
                             "first_differing_build": mism[0] if mism else None})
                r = rows[-1]
                print(f"B{b} {backend} budget {budget}: lossless {r['lossless']}, tau live {r['tau_live']:.2f}, "
                      f"first diff round {r['first_diff_round']}, builds differing {len(mism)}/{r['builds_compared']}"
                      f" {mism[0] if mism else ''}", flush=True)
                (out / "live_diag.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
