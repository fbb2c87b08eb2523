#!/usr/bin/env bash
# Issue 17 on one H200 (~1-2 min): the topology scenario with gpus: 1 over NCCL (kimi-k2-slice-2 bf16 prefill,
# AR decode, tree verify, EP MoE; tp and ep) against one process, the collective sweep 4 KiB .. 1 GiB at one
# rank plus the step's own message sizes; the 2-GPU case must come back as a skipped row with the reason.
# Usage (device machine, repo root): bash reports/h200/run_topology_gpu1.sh "$OUT"
# Files back in OUT: topology-gpu1.tar.gz (records, report.html, per-rank JSON, NCCL logs), topology_nvidia_smi.txt
# (and topology_install.log when it had to install); the summary goes to stdout.
set -o pipefail
out=${1:-${OUT:-/tmp/topology-out}}
mkdir -p "$out"
t0=$(date +%s)
# install unless this tree's kdbench (with kdbench.parallel) is already the importable one
python3 -c "import kdbench.parallel.worker, kdbench, os, sys; sys.exit(not kdbench.__file__.startswith(os.getcwd()))" 2>/dev/null \
  || python3 -m pip install -q --no-build-isolation --no-deps -e . > "$out/topology_install.log" 2>&1 \
  || { tail -20 "$out/topology_install.log"; exit 1; }
nvidia-smi topo -m > "$out/topology_nvidia_smi.txt" 2>&1
run=$(mktemp -d)/topology-gpu1   # the run dir holds per-rank files and NCCL logs: it comes back as one archive
timeout 240 kdbench run scenarios/topology/h200_gpu1.yaml --device cuda --out "$run" 2>&1 | tail -20
echo "topology rc=$? $(( $(date +%s) - t0 )) s"
tar -czf "$out/topology-gpu1.tar.gz" -C "$(dirname "$run")" topology-gpu1
python3 - "$run" <<'PY'
import json, sys
from pathlib import Path
rows = [json.loads(l) for l in Path(sys.argv[1], "records.jsonl").read_text().splitlines()]
nan = float("nan")
num = lambda v: nan if v is None else v   # noqa: E731 - NaN is stored as null
for r in rows:
    r["phase"] = r.get("phase") or r["family"]   # the phase moved out of `family` (records before 2026-12-01)
for r in rows:
    if r["phase"].startswith("comm"):
        continue
    e = r["extra"]
    print(f"{r['case']:<20} {r['phase']:<8} {r['status']:<7} t={num(r['time_median_s'])*1e3:8.3f} ms "
          f"comm={num(e.get('comm_s'))*1e3:7.3f} ms rel_l2={num(r['rel_l2']):.3g} "
          f"transport={e.get('transport', '')} syncs={e.get('host_syncs', '')[:40]} "
          f"breakeven_tau={num(e.get('breakeven_tau')):.2f} {r['reason'][:90]}")
for r in rows:
    if r["phase"].startswith("comm:all_reduce") or r["phase"].startswith("comm-step"):
        e = r["extra"]
        print(f"{r['phase']:<34} {num(r['time_median_s'])*1e6:9.1f} us algbw {e['algbw_GBps']:8.2f} GB/s")
PY
