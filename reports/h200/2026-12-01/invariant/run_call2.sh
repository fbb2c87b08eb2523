#!/usr/bin/env bash
# Second H200 call of issue 12 (after the stride-0 key-list fix): the slice-2 forward invariance + cost script,
# then the two GPU tests that the first call's illegal address (B = 1 key lists) stopped. ~90 s.
set -uo pipefail
out=${1:?OUT_DIR}; mkdir -p "$out"; export PYTHONUNBUFFERED=1; t0=$(date +%s); here=reports/h200/2026-12-01/invariant
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1; at install
timeout 45 python3 $here/invariant_gpu.py "$out" > "$out/invariant_gpu.log" 2>&1; at "invariant_gpu rc=$?"
grep -A2 "failures" "$out/invariant_gpu.log" | head -6
timeout 40 python3 -m pytest -q -p no:cacheprovider --benchmark-skip -k "cuda and (attention or forward)" \
  tests/test_batch_invariant.py tests/test_batch_invariant_model.py > "$out/gpu_tests.log" 2>&1; at "gpu tests rc=$?"
tail -3 "$out/gpu_tests.log"
