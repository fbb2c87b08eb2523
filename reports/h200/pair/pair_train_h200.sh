#!/usr/bin/env bash
# Train the shipped pair on one H200 (plans/0007): ~4.5 minutes. Run from a copy of the tree that holds
# .kdbench/corpus.jsonl.xz (built here by `kdbench corpus`: the GPU machine's Python is 3.12, not 3.11.7).
# Writes $OUT/pair/{pair_target.kdtr, pair_drafter.kdtr, pair_meta.json, loss_*.json} and $OUT/train_log.txt.
set -eo pipefail
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
python3 -u -m kdbench train --out "$OUT/pair" --device cuda --size full --seed 0 \
  --target-seconds "${TARGET_SECONDS:-140}" --drafter-seconds "${DRAFTER_SECONDS:-75}" --check 2>&1 | tee "$OUT/train_log.txt"
