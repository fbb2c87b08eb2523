#!/usr/bin/env bash
# H200 call F (session 2): kv_compact with the one-wave grid-stride launch (commit 47b9623; slower, reverted):
# the GPU tests, then the bench shapes B 64 / 128 on the inputs of the committed scenario rows
# (reports/h200/time_kv_compact.py). ~3 minutes.
# Usage (device machine, repo root): KDBENCH_GIT_SHA=<sha> bash reports/h200/run_call_f.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg; t0=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
timeout 150 kdbench build > "$out/build.log" 2>&1; echo "build rc=$? at $(( $(date +%s) - t0 )) s"
timeout 40 python3 -m pytest -q --benchmark-skip -p no:cacheprovider tests/test_kv_compact.py > "$out/kv_compact_tests.log" 2>&1
echo "kv_compact GPU tests rc=$?"; tail -2 "$out/kv_compact_tests.log"
timeout 60 python3 reports/h200/time_kv_compact.py "$out" 2>&1 | tail -3; echo "done at $(( $(date +%s) - t0 )) s"
