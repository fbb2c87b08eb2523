#!/usr/bin/env bash
# H200: the benchmark grids of issue 5, in parts of <= 9 minutes each (build included). Every run lands in
# WORK/<step>/ and the part comes back as one file, OUT/grid_<part>.tgz (run dirs + logs).
# Usage (device machine, repo root): KDBENCH_GIT_SHA=<sha> bash reports/h200/run_grid.sh OUT PART
#   a  tree_verify_mla: batch 8, batch 1, batch 32 at past 1K and 8K, the 5 anchor shapes (101 cases)
#   b  tree_build grid (32), tree_accept (B 64), tree_verify_mla batch 32 at past 32K (12), kv_compact
#      B 8, 64 and 128 (61 layers), then the validation cases of tree_verify_mla and tree_build if time is left
#   c  leftovers: the validation cases of tree_verify_mla and tree_build
# Each step stops at the part's deadline (GRID_DEADLINE_S, default 530 s after the start) with SIGINT:
# finished cases are kept (meta.json status "interrupted"); a step that cannot start in time is skipped.
#
# Estimate (seconds of device time; the cuda_mma backend counted in every verify case). GPU per case:
# kernel ~ floor / 0.3, floor = max(bytes / 4.24e12, flops / 789e12) (suite/families/*.py); SDPA and the
# two-pass ~4x the kernel (>= 0.8 / 1.8 ms, launch-bound), eager ~6x (>= 1 ms; out of memory, a quick skip,
# when the fp32 scores B*T*H*(ctx+T)*4 bytes pass ~100 GB); each backend runs warmup + repeat + trials + 1
# re-check times. Host per case, measured on a 2-core box and divided by 1.5 for a device core (the
# 2026-11-29 verify run gives 1.5) and by 8 for work on threads: float32 normals 20 ns each (threads);
# the float64 reference 0.1 ns per byte of kv its per-row matmuls stream + 100 ns per (row, head, key)
# (threads over requests x 32-head chunks, with OPENBLAS_NUM_THREADS=1); check.compare 170 ns per output
# element (one core, x backends x 2); one f32 -> bf16 device copy 0.15 s/GB; ~15 s per kdbench run.
# tree_build: Python heap 20 us per node (b x budget) a call, C++ heap 1.3 us; kv_compact: float64 draws
# (one core) + exact compares of the whole cache, 61 x B x 81 x 576 elements, 2 backends x 2.
#   step (cases)                      GPU    host   total   | verify by batch x past (total, s)
#   a: verify_a (101)                  60     286     362   |        1K    8K   32K
#   b: tree_build (32)                 49      13      77   | B 1    33    47    85
#   b: tree_accept (10)                 3       5      23   | B 8    38    53    92
#   b: verify_b (12)                   57      73     145   | B 32   37    66   145
#   b: kv_compact B 8, 64 (2)           0     100     115   | anchors 31
#   b/c: kv_compact128 (1)              0     177     192   | tree_build by batch 1/8/32/64:
#   c: verify_validate (29)             0      65      80   |   16 / 20 / 34 / 53
#   c: tree_build_validate (24)        17       7      39   |
# Part a ~450 s with a cold build (~90 s), part b ~450 s warm. kv_compact's cost was check.compare over the
# whole cache; its exact-equality fast path (one array_equal) brings B 128 from ~190 s to ~30 s.
# The host figures are +-50 %: the deadline keeps a part inside its call.
set -uo pipefail
out=${1:?OUT_DIR}; part=${2:?PART: a, b or c}; t0=$(date +%s); deadline=${GRID_DEADLINE_S:-530}
case $part in a|b|c) ;; *) echo "unknown PART $part: expected a, b or c"; exit 2 ;; esac
work=${GRID_WORK:-/tmp/kdbench_grid}/$part; rm -rf "$work"; mkdir -p "$work" "$out"   # a rerun starts clean
# OPENBLAS_NUM_THREADS=1: the float64 references run on one thread per request (common.parallel_map)
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg OPENBLAS_NUM_THREADS=1
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
pack() { tar -czf "$out/grid_$part.tgz" -C "${work%/*}" "$part"; at "packed $out/grid_$part.tgz"; }
trap pack EXIT
# step NAME NEED_S SCENARIO [--filter EXPR]...: kdbench run into WORK/NAME if NEED_S seconds remain
step() {
  local name=$1 need=$2; shift 2
  local left=$(( deadline - ($(date +%s) - t0) ))
  if (( left < need )); then echo "skipped $name: $left s left, it needs ~$need s"; return; fi
  timeout -s INT -k 30 "$left" kdbench run "$@" --device cuda --out "$work/$name" > "$work/$name.log" 2>&1
  at "$name rc=$?"; grep -E "^records:|FAIL|ERROR|interrupted" "$work/$name.log" | head -8
}
{ nvidia-smi; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; } > "$work/env.txt" 2>&1
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$work/install.log" 2>&1 || { tail -20 "$work/install.log"; exit 1; }
timeout 300 kdbench build > "$work/build.log" 2>&1; at "build rc=$?"
V=scenarios/kernels/tree_verify_mla.yaml; K=scenarios/kernels/kv_compact.yaml
case $part in
  a) step verify_a 60 $V --filter 'bench[' --filter bench-b1 --filter 'bench-b32,past_len=1024' \
       --filter 'bench-b32,past_len=8192' --filter bench-batch --filter bench-small-heads ;;
  b) step tree_build 40 scenarios/kernels/tree_build.yaml --filter bench
     step tree_accept 20 scenarios/kernels/tree_accept.yaml
     step verify_b 60 $V --filter 'bench-b32,past_len=32768'
     step kv_compact 60 $K --filter bench
     step verify_validate 60 $V --filter validate
     step tree_build_validate 30 scenarios/kernels/tree_build.yaml --filter validate ;;
  c) step verify_validate 60 $V --filter validate
     step tree_build_validate 30 scenarios/kernels/tree_build.yaml --filter validate ;;
esac
