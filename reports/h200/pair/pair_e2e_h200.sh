#!/usr/bin/env bash
# The trained pair on one H200 in one go (plans/0007): the e2e scenario (batch 1 / 8 / 32, AR, chain, ddtree,
# torch and CUDA stages, graph-mode step times for ddtree on cuda), the rest of the acceptance sweep (T = 1,
# width-capped, static k-ary; greedy ddtree / chain are committed), and the T > 0 distribution check at
# >= 20k tokens per arm (T = 0.8 and 1.0, with the planted-bug power check). About 6 minutes including the
# CUDA extension build. Results: $OUT/pair_e2e, $OUT/pair_accept, $OUT/pair_dist.json, $OUT/pair_log.txt.
# PAIR_PARTS picks the parts (default "e2e accept dist"; e2e alone is about 3 minutes).
set -o pipefail
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 -m kdbench build 2>&1 | tail -1
parts=" ${PAIR_PARTS:-e2e accept dist} "
{
  [[ $parts == *" e2e "* ]] && python3 -u -m kdbench run scenarios/e2e/h200_trained.yaml --device cuda --out "$OUT/pair_e2e"
  [[ $parts == *" accept "* ]] && python3 -u -m kdbench run scenarios/acceptance/trained_sweep.yaml --device cuda \
    --out "$OUT/pair_accept" --filter "temperature=1.0" --filter "width-capped" --filter "static-kary"
  [[ $parts == *" dist "* ]] && python3 -u reports/h200/pair/pair_distribution.py --device cuda --out "$OUT/pair_dist.json"
  true
} 2>&1 | tee "$OUT/pair_log.txt"
