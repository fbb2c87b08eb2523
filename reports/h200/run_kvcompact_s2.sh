#!/usr/bin/env bash
# H200 call for issue 16 item 2 (kv_compact): the standalone variant bench (check, timing, compute-sanitizer
# memcheck + racecheck) while the extension builds, then the kv_compact GPU tests, the kv_compact scenario and
# sanitize_kernels.py under memcheck (kv_compact kernels only). ~110 s. Results in OUT/kvc/, packed as OUT/kvc.tgz.
# Usage (device machine, repo root; build/kv_compact_bench prebuilt by the nvcc line in kv_compact_bench.cu):
#   KDBENCH_GIT_SHA=<sha> bash reports/h200/run_kvcompact_s2.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}/kvc; mkdir -p "$out"; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg MAX_JOBS=16; t0=$(date +%s)
at() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$out/driver.log"; }
pack() { tar -czf "${out%/kvc}/kvc.tgz.tmp" -C "${out%/kvc}" kvc && mv "${out%/kvc}/kvc.tgz.tmp" "${out%/kvc}/kvc.tgz"; }
trap pack EXIT
# kdbench from the tree without pip install (the pybind11 CPU extensions, ~20 s to build, are not used here)
mkdir -p /tmp/pp && ln -sfn "$PWD/suite" /tmp/pp/kdbench && ln -sfn ../references suite/references
export PYTHONPATH=/tmp/pp
nvidia-smi -q -d CLOCK,PERFORMANCE > "$out/clocks.txt" 2>&1
(timeout 150 python3 -m kdbench build > "$out/build.log" 2>&1; echo "build rc=$?" >> "$out/build.log") &
builder=$!
bench=build/kv_compact_bench
[ -x "$bench" ] || nvcc -O3 -std=c++20 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc \
  reports/h200/kv_compact_bench.cu -o "$bench"
timeout 60 "$bench" check > "$out/bench_check.log" 2>&1; at "bench check rc=$?"; tail -1 "$out/bench_check.log"
timeout 60 "$bench" time "$out/bench_timing.json" > "$out/bench_timing.log" 2>&1; at "bench time rc=$?"
cat "$out/bench_timing.log"; pack
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 "$bench" sanitize > "$out/bench_sanitizer_$tool.log" 2>&1
  at "bench compute-sanitizer $tool rc=$?"; tail -2 "$out/bench_sanitizer_$tool.log"
done
wait $builder; at "$(tail -1 "$out/build.log")"; pack
timeout 60 python3 -m pytest -q -rs --benchmark-skip -p no:cacheprovider tests/test_kv_compact.py > "$out/tests.log" 2>&1
at "kv_compact GPU tests rc=$?"; tail -2 "$out/tests.log"; pack
# bench cases only: call 1 (commit 870934d) ran all 11 cases and was cut after 3 validate cases (~38 s each)
timeout 120 python3 -m kdbench run scenarios/kernels/kv_compact.yaml --device cuda --filter bench --out "$out/run" \
  > "$out/run.log" 2>&1
at "kdbench run rc=$?"; tail -3 "$out/run.log"; pack
python3 - "$out/run/records.jsonl" <<'EOF' 2>&1 | tee -a "$out/driver.log"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["case"].startswith("bench") and r.get("time_median_s"):
        print(r["case"], r["backend"], r["status"], f"{r['time_median_s'] * 1e6:.1f} us",
              f"floor {r['floor_s'] * 1e6:.1f} us = {r['pct_of_floor_rate']:.1f} %")
EOF
timeout 60 compute-sanitizer --tool memcheck --kernel-name kns=kv_compact --error-exitcode 9 \
  python3 reports/h200/sanitize_kernels.py > "$out/sanitizer_memcheck.log" 2>&1
at "sanitize_kernels.py memcheck (kv_compact) rc=$?"; tail -2 "$out/sanitizer_memcheck.log"
at "done"
