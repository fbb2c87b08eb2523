#!/usr/bin/env bash
# The next H200 call: what the first session left open (plans/0001 "where it stands"). ~8 minutes.
# Usage (device machine, repo root): KDBENCH_GIT_SHA=<sha> bash reports/h200/run_open_items.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg; t0=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1; kdbench build > /dev/null 2>&1
echo "build ready at $(( $(date +%s) - t0 )) s"
# issue 5: the vocabulary pass alone against its memory floor
timeout 120 python3 reports/h200/time_vocab_pass.py "$out"
# issue 4: greedy DDTree == AR at kimi-k2-slice-2, batch 8, budget 64 (float32 target)
timeout 150 kdbench run scenarios/acceptance/h200_slice2.yaml --device cuda --out "$out/exact" \
  --filter 'ddtree-f32-exact-b8' 2>&1 | tail -3
# issue 6: the nightly twice (an A/A pair must show no 'slower'), then accept the first as the H200 baseline
timeout 120 kdbench nightly --out "$out/n1" 2>&1 | tail -2
timeout 120 kdbench nightly --out "$out/n2" 2>&1 | tail -2
timeout 60 kdbench compare "$out/n1" "$out/n2" 2>&1 | tail -2
echo "done at $(( $(date +%s) - t0 )) s (then: kdbench nightly --update-baseline <n1 copied back>)"
