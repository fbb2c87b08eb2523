#!/usr/bin/env bash
# One GPU call for the fused-MoE work (plans/0015), from the repo root: GPU tests of the MoE paths, the
# moe_experts kernel scenario (records.jsonl), the kimi-k2-slice-2 layer timing (time_moe.py); optionally a
# bounded try of FlashInfer's sm90 fused-MoE JIT build in the background (FI_BUILD_S seconds, 0 = skip).
# kdbench is imported from a folder of links (no C++ host-extension build: the MoE paths do not use them).
# Usage: KDBENCH_GIT_SHA=<sha> [WHL=.whl] [FI_BUILD_S=60] [QUICK=--quick] bash reports/h200/moe_call.sh OUT
set -uo pipefail
out=${1:?OUT}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg FLASHINFER_CUDA_ARCH_LIST=9.0a
t0=$(date +%s); at() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$out/driver.log"; }
mkdir -p /tmp/kd/kdbench && for f in "$PWD"/suite/*; do ln -sfn "$f" /tmp/kd/kdbench/; done
ln -sfn "$PWD/references" /tmp/kd/kdbench/references
export PYTHONPATH=/tmp/kd
if [ -n "${WHL:-}" ] && ls "$WHL"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl >> "$out/driver.log" 2>&1
  at "wheels rc=$?"; export PYTHONPATH=/tmp/kd:/tmp/site
fi
if [ "${FI_BUILD_S:-0}" -gt 0 ]; then   # how far FlashInfer's fused-MoE JIT gets in FI_BUILD_S s (8 jobs, niced)
  ( MAX_JOBS=8 timeout "$FI_BUILD_S" nice -n 10 python3 -c "
import time; t = time.time()
from flashinfer.fused_moe import core
core.get_cutlass_fused_moe_module('90')
print(f'built in {time.time() - t:.0f} s')" > "$out/fi_build.log" 2>&1; echo "rc=$? (124 = cut off at ${FI_BUILD_S} s)" >> "$out/fi_build.log"
    ls ~/.cache/flashinfer -R 2>/dev/null | grep -c '\.o$' | sed 's/^/objects built: /' >> "$out/fi_build.log" ) &
  fi_pid=$!
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >> "$out/driver.log" 2>&1
python3 -m pytest -q -p no:cacheprovider --benchmark-skip -rs tests/test_moe_experts.py > "$out/gpu_tests.log" 2>&1
at "gpu tests rc=$? ($(tail -1 "$out/gpu_tests.log"))"
python3 reports/h200/time_moe.py "$out" ${QUICK:-} > "$out/time_moe.out" 2>&1; at "time_moe rc=$?"
python3 -m kdbench run scenarios/kernels/moe_experts.yaml --device cuda --out /tmp/moe_run > "$out/scenario.log" 2>&1
at "scenario rc=$?"; cp /tmp/moe_run/records.jsonl "$out/records.jsonl" 2>/dev/null
if [ -n "${fi_pid:-}" ]; then wait "$fi_pid"; at "flashinfer build try: $(tr '\n' ' ' < "$out/fi_build.log" | tail -c 300)"; fi
at done
