#!/usr/bin/env bash
# First H200 call: install, JIT-build the CUDA extension, run the GPU tests and the smoke scenario on cuda.
# Usage (device machine, repo root): bash reports/h200/gpu_check.sh OUT_DIR
set -uo pipefail
out=${1:-/tmp/kdb-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
{ nvidia-smi; nvidia-smi topo -m; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; } > "$out/env.txt" 2>&1
t0=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 || { tail -30 "$out/install.log"; exit 1; }
echo "install $(( $(date +%s) - t0 )) s"
timeout 400 kdbench build --verbose > "$out/build.log" 2>&1; echo "build rc=$? $(( $(date +%s) - t0 )) s"
grep -E "error|registers|spill" "$out/build.log" | head -40
timeout 300 python3 -m pytest -q --maxfail=40 --benchmark-skip -p no:cacheprovider tests/test_cuda_build.py tests/test_kv_compact.py \
  tests/test_tree_accept.py tests/test_tree_build.py tests/test_tree_verify_mla.py > "$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$? $(( $(date +%s) - t0 )) s"; tail -40 "$out/gpu_tests.log"
