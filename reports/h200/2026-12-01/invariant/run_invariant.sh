#!/usr/bin/env bash
# H200 check of issue 12 (batch-invariant target): the GPU invariance tests of every op and of the whole forward,
# forward invariance on kimi-k2-slice-2 + per-op cost (invariant_gpu.py), and the exact-greedy bf16 e2e
# (scenarios/e2e/h200_slice2_invariant.yaml; PART=inv runs the invariant cases only).
# ~95 s on a warm H200 (install 20, tests 30, forward check + cost 15, e2e 25); PART=inv: ~80 s.
# Usage (device machine, repo root): bash reports/h200/2026-12-01/invariant/run_invariant.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}; mkdir -p "$out"; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg; t0=$(date +%s)
here=reports/h200/2026-12-01/invariant
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 \
  || { tail -5 "$out/install.log"; exit 1; }
at install
timeout 90 python3 -m pytest -q -p no:cacheprovider --benchmark-skip -k "cuda" tests/test_batch_invariant.py \
  tests/test_batch_invariant_model.py > "$out/gpu_tests.log" 2>&1; at "gpu tests rc=$?"; tail -4 "$out/gpu_tests.log"
timeout 60 python3 $here/invariant_gpu.py "$out" > "$out/invariant_gpu.log" 2>&1; at "invariant_gpu rc=$?"
grep -A3 "failures" "$out/invariant_gpu.log" | head -8
filter=(); [ "${PART:-all}" = inv ] && filter=(--filter inv-)
timeout 150 kdbench run scenarios/e2e/h200_slice2_invariant.yaml --device cuda --out "$out/e2e" "${filter[@]}" \
  > "$out/e2e.log" 2>&1; at "e2e rc=$?"; tail -3 "$out/e2e.log"
python3 $here/summarize_e2e.py "$out/e2e/records.jsonl" | tee "$out/e2e_summary.txt"
