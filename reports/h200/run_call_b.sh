#!/usr/bin/env bash
# H200 call B (session 2): tree_build after the vocabulary-pass change (GPU tests, timing), ncu on the
# vocabulary pass and both verify paths, the engine GPU tests, the timing launch-shield test, the nightly A/A
# pair with the new gating, and issue 4's float32 e2e run (slice-2, B 8, budget 64: stage times + greedy == AR).
# Everything lands in OUT/b/ and comes back as OUT/call_b.tgz.
# Usage (device machine, repo root): KDBENCH_GIT_SHA=<sha> bash reports/h200/run_call_b.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}/b; mkdir -p "$out"; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg; t0=$(date +%s)
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
trap 'tar -czf "${out%/b}/call_b.tgz" -C "${out%/b}" b' EXIT
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
timeout 300 kdbench build --verbose > "$out/build.log" 2>&1; at "build rc=$?"
timeout 200 python3 -m pytest -q -rs --maxfail=6 --benchmark-skip -p no:cacheprovider tests/test_tree_build.py \
  tests/test_timing.py tests/test_engine_batch.py tests/test_engine_graph.py > "$out/gpu_tests.log" 2>&1
at "tree_build / timing / engine GPU tests rc=$?"; tail -6 "$out/gpu_tests.log"
timeout 60 python3 reports/h200/time_vocab_pass.py "$out" 2>&1 | tail -5; at "vocab pass"
timeout 120 ncu --clock-control none -k regex:'topk|tree_verify_mla_kernel' --section SpeedOfLight \
  --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis python3 reports/h200/ncu_kernels.py \
  > "$out/ncu.txt" 2>&1; at "ncu rc=$?"; grep -E "topk|tree_verify|Throughput|Duration" "$out/ncu.txt" | head -30
timeout 100 kdbench nightly --out "$out/n1" > "$out/nightly1.log" 2>&1; at "nightly 1 rc=$?"
timeout 100 kdbench nightly --out "$out/n2" > "$out/nightly2.log" 2>&1; at "nightly 2 rc=$?"
timeout 60 kdbench compare "$out/n1" "$out/n2" --out "$out/aa_compare.html" > "$out/aa_compare.log" 2>&1
at "A/A compare rc=$?"; tail -2 "$out/aa_compare.log"
timeout 260 kdbench run scenarios/e2e/h200_slice2.yaml --device cuda --out "$out/e2e_f32" --filter ddtree-b64-f32 \
  > "$out/e2e_f32.log" 2>&1; at "e2e float32 rc=$?"; tail -6 "$out/e2e_f32.log"
