#!/usr/bin/env bash
# H200 calls 2 and 3: the kernel scenarios (validation + benchmarks), then e2e / acceptance and graph timing.
# Usage (device machine, repo root, after run_tests.sh built the extension): bash reports/h200/run_bench.sh OUT part
set -uo pipefail
out=${1:?OUT_DIR}; part=${2:?kernels|engine}; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg; t0=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
kdbench build > /dev/null 2>&1; echo "build ready at $(( $(date +%s) - t0 )) s"
if [ "$part" = kernels ]; then
  timeout 560 kdbench run scenarios/kernels/tree_verify_mla.yaml scenarios/kernels/tree_build.yaml \
    scenarios/kernels/tree_accept.yaml scenarios/kernels/kv_compact.yaml --device cuda --out "$out/kernels" 2>&1 | tail -12
else
  timeout 300 python3 reports/h200/graph_timing.py "$out" 2>&1 | tail -20
  timeout 400 kdbench run scenarios/e2e/h200_slice2.yaml scenarios/acceptance/h200_slice2.yaml --device cuda \
    --out "$out/engine" 2>&1 | tail -12
fi
echo "done at $(( $(date +%s) - t0 )) s"
