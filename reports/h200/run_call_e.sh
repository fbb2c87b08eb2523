#!/usr/bin/env bash
# H200 call E (session 2): the tree_build validation cases under the family's two-level check, then the engine
# with the wgmma verify kernel: e2e slice-2 B 8 budget 64 (bf16, cuda vs torch stages) and the step eager vs
# CUDA graph. ~5 minutes. Returns OUT/call_e.tgz.
# Usage (device machine, repo root): KDBENCH_GIT_SHA=<sha> bash reports/h200/run_call_e.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}/e; mkdir -p "$out"; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg OPENBLAS_NUM_THREADS=1; t0=$(date +%s)
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
trap 'tar -czf "${out%/e}/call_e.tgz" -C "${out%/e}" e' EXIT
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
timeout 200 kdbench build > "$out/build.log" 2>&1; at "build rc=$?"
timeout 60 kdbench run scenarios/kernels/tree_build.yaml --device cuda --out "$out/tree_build_validate" \
  --filter validate > "$out/tree_build_validate.log" 2>&1; at "tree_build validate rc=$?"; tail -3 "$out/tree_build_validate.log"
timeout 60 python3 reports/h200/graph_timing.py "$out" > "$out/graph_timing.log" 2>&1; at "graph timing rc=$?"
grep -E "step_s|share|speedup" "$out/graph_timing.log" | head -8
timeout 130 kdbench run scenarios/e2e/h200_slice2.yaml --device cuda --out "$out/e2e" --filter ddtree-b64 \
  > "$out/e2e.log" 2>&1; at "e2e bf16 rc=$?"; tail -3 "$out/e2e.log"
