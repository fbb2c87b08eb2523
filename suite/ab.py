"""Same-machine A/B: run the base code (a git revision checked out in a worktree, or a source tree) and this
code on the same scenarios in interleaved ABBA rounds, one subprocess per round, pool each side's samples
and hand the two pooled runs to regress.compare. plans/0014-same-machine-ab.md says why and how.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kdbench.errors import UserError
from kdbench.results import Record, RunWriter, load_meta, load_records

REPO_ROOT = Path(__file__).resolve().parents[1]
BOOT = Path(__file__).resolve().parent / "ab_boot.py"   # runs `kdbench` from a given source tree


@dataclass(frozen=True)
class AbPlan:
    """What one A/B compare runs: the same scenario files and filters on both sides, `rounds` ABBA pairs."""
    against: str                      # a git revision of this repository, or a path to a source tree
    scenarios: tuple[str, ...]
    out_dir: Path                     # rounds go to out_dir/rounds/NN-{base,new}; pooled runs to base/, new/
    filters: tuple[str, ...] = ()
    device: str = "auto"
    rounds: int = 2                   # pairs; order A B, B A, A B, ... so drift hits both sides alike


def order(rounds: int) -> list[str]:
    """ABBA interleaving: rounds=2 -> base new new base."""
    return [side for r in range(rounds) for side in (("base", "new") if r % 2 == 0 else ("new", "base"))]


def _is_tree(path: Path) -> bool:
    return (path / "suite" / "__init__.py").is_file() and (path / "references").is_dir()


@contextlib.contextmanager
def base_tree(against: str, repo: Path = REPO_ROOT):
    """Yield (source tree, label, commit) for REV: a path to a source tree is used as it is (the GPU machine
    gets a copy of the files whose .git may be older than they are); anything else is a git revision checked
    out in a temporary detached worktree, its C++ extensions built in place, removed afterwards."""
    path = Path(against).expanduser()
    if path.exists():
        if not _is_tree(path):
            raise UserError(f"--against {against}: a directory without suite/__init__.py and references/; "
                            "expected a kdbench source tree or a git revision")
        yield path.resolve(), str(path), ""
        return
    sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{against}^{{commit}}")
    if not sha:
        raise UserError(f"--against {against}: neither a directory nor a git revision of {repo}")
    work = Path(tempfile.mkdtemp(prefix="kdbench-ab-"))
    tree = work / "tree"
    try:
        _git(repo, "worktree", "add", "--detach", "--quiet", str(tree), sha, check=True)
        _build_extensions(tree)
        yield tree, f"{against} ({sha[:10]})", sha[:10]
    finally:
        _git(repo, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(work, ignore_errors=True)


def _git(repo: Path, *args: str, check: bool = False) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if check and proc.returncode:
        raise UserError(f"git {' '.join(args[:2])}: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}")
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _build_extensions(tree: Path) -> None:
    """The pybind11 CPU extensions (_kdtr, _cpu_heap) next to the tree's sources, as an editable install
    would; the CUDA extension is JIT-built by the tree's own cuda_build, whose cache key hashes its sources."""
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                          capture_output=True, text=True)
    if proc.returncode:
        print(f"ab: building the base tree's C++ extensions failed; rows needing them will error:\n"
              f"{proc.stderr[-800:]}", file=sys.stderr)


def _command(tree: Path | None, plan: AbPlan, out: Path) -> list[str]:
    args = ["run", *plan.scenarios, "--device", plan.device, "--out", str(out)]
    for f in plan.filters:
        args += ["--filter", f]
    if tree is None and not _is_tree(REPO_ROOT):   # this code, installed without its source tree
        return [sys.executable, "-m", "kdbench", *args]
    return [sys.executable, str(BOOT), str(tree or REPO_ROOT), *args]


def run_rounds(plan: AbPlan, tree: Path, commit: str = "") -> dict[str, list[Path]]:
    """Run the rounds in ABBA order; returns the round directories per side. A round that exits 2 (bad input,
    e.g. a scenario key the base code does not know) stops the compare with its message."""
    dirs: dict[str, list[Path]] = {"base": [], "new": []}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for i, side in enumerate(order(plan.rounds)):
        out = plan.out_dir / "rounds" / f"{i:02d}-{side}"
        shutil.rmtree(out, ignore_errors=True)
        side_env = dict(env, KDBENCH_GIT_SHA=commit) if side == "base" and commit else env
        cmd = _command(tree if side == "base" else None, plan, out)
        print(f"ab: round {i + 1}/{2 * plan.rounds} {side}: {cmd[2]} ...", file=sys.stderr)
        proc = subprocess.run(cmd, env=side_env, capture_output=True, text=True)
        if proc.returncode == 2 or not (out / "meta.json").exists():
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"--against: the {side} round {i + 1} could not run: {tail}")
        dirs[side].append(out)
    return dirs


def pool(records: list[list[Record]]) -> list[Record]:
    """One record per key over the rounds of one side: samples concatenated in round order, median/p20/p80
    recomputed from them, the worst status kept (a failure in any round fails), clocks the median of the
    rounds' medians, throttle reasons their union, and extra['ab_level_s'] = the lowest round's p20."""
    by_key: dict[tuple, list[Record]] = {}
    for recs in records:
        for r in recs:
            by_key.setdefault(r.key(), []).append(r)
    return [_pooled(group) for group in by_key.values()]


_RANK = {"error": 0, "fail": 1, "skipped": 2, "pass": 3, "info": 4}


def _pooled(group: list[Record]) -> Record:
    worst = min(group, key=lambda r: _RANK.get(r.status, 0))
    data = dict(vars(worst))
    samples = [s for r in group for s in r.samples_s]
    data["samples_s"], data["n_samples"] = samples, len(samples)
    if samples:
        q = statistics.quantiles(samples, n=5, method="inclusive") if len(samples) > 1 else samples * 4
        data.update(time_median_s=statistics.median(samples), time_p20_s=q[0], time_p80_s=q[3])
    clocks = [r.sm_clock_mhz for r in group if r.sm_clock_mhz == r.sm_clock_mhz]
    if clocks:
        data["sm_clock_mhz"] = statistics.median(clocks)
    data["throttle"] = ",".join(sorted({t for r in group for t in r.throttle.split(",") if t}))
    lows = [r.time_p20_s for r in group if r.samples_s and r.time_p20_s > 0]
    data["extra"] = dict(worst.extra, ab_rounds=len(group), ab_round_p20_s=lows,
                         ab_round_medians_s=[r.time_median_s for r in group if r.samples_s])
    if lows:   # the level regress.compare takes the change from: contention only adds time (plan 0014 §2)
        data["extra"]["ab_level_s"] = min(lows)
    return Record(**data)


def write_pooled(side: str, rounds: list[Path], out: Path, label: str) -> Path:
    """out/<side>/records.jsonl + meta.json: a run directory regress.compare reads like any other; 'finished'
    only when every round finished."""
    shutil.rmtree(out, ignore_errors=True)
    metas = [load_meta(d) for d in rounds]
    writer = RunWriter(out)
    for rec in pool([load_records(d) for d in rounds]):
        writer.add(rec)
    meta = dict(metas[0])
    meta.update(status="finished" if all(m.get("status") == "finished" for m in metas) else "partial",
                ab={"side": side, "source": label, "rounds": [str(d) for d in rounds]},
                parts=[{"commit": (m.get("fingerprint") or {}).get("git", {}).get("sha", ""),
                        "status": m.get("status"), "started_at": m.get("started_at"),
                        "command": m.get("command", "")} for m in metas])
    writer.write_meta(meta)
    return out


def run_ab(plan: AbPlan) -> tuple[Path, Path, str]:
    """Run both sides and pool them; returns (base run dir, new run dir, base label)."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    with base_tree(plan.against) as (tree, label, commit):
        dirs = run_rounds(plan, tree, commit)
    base = write_pooled("base", dirs["base"], plan.out_dir / "base", label)
    new = write_pooled("new", dirs["new"], plan.out_dir / "new", "this tree")
    (plan.out_dir / "ab.json").write_text(json.dumps(
        {"against": plan.against, "label": label, "order": order(plan.rounds), "scenarios": plan.scenarios,
         "filters": plan.filters}, indent=2), encoding="utf-8")
    return base, new, label
