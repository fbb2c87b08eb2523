#!/usr/bin/env bash
# H200 call C (session 2): the verify grid, part a of run_grid.sh (deadline 470 s, build included), then the
# tree_build GPU tests and the vocabulary-pass timing after the second vocabulary-pass change.
# Returns OUT/grid_a.tgz, OUT/tree_build_tests.log, OUT/vocab_pass.json.
# Usage (device machine, repo root): KDBENCH_GIT_SHA=<sha> bash reports/h200/run_call_c.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
GRID_DEADLINE_S=470 bash reports/h200/run_grid.sh "$out" a
timeout 60 python3 -m pytest -q -rs --maxfail=6 --benchmark-skip -p no:cacheprovider tests/test_tree_build.py \
  > "$out/tree_build_tests.log" 2>&1; echo "tree_build GPU tests rc=$?"; tail -2 "$out/tree_build_tests.log"
timeout 45 python3 reports/h200/time_vocab_pass.py "$out" 2>&1 | tail -4
