#!/usr/bin/env bash
# H200: the kernel scenarios (validation + benchmarks). part: verify | rest. Usage: run_kernels.sh OUT part
set -uo pipefail
out=${1:?OUT_DIR}; part=${2:?verify|rest}; export PYTHONUNBUFFERED=1 MPLBACKEND=Agg; t0=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
kdbench build > /dev/null 2>&1; echo "build ready at $(( $(date +%s) - t0 )) s"
if [ "$part" = verify ]; then
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kv_compact.py tests/test_tree_build.py \
    tests/test_tree_accept.py tests/test_tree_verify_mla.py -k "bad or arg or check" 2>&1 | tail -3
  timeout 480 kdbench run scenarios/kernels/tree_verify_mla.yaml --device cuda --out "$out/verify" 2>&1 | tail -8
else
  timeout 500 kdbench run scenarios/kernels/tree_build.yaml scenarios/kernels/tree_accept.yaml \
    scenarios/kernels/kv_compact.yaml --device cuda --out "$out/rest" 2>&1 | tail -8
fi
echo "done at $(( $(date +%s) - t0 )) s"
