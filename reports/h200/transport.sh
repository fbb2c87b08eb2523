#!/usr/bin/env bash
# The device tool carries the tracked tree (+ carried paths) up to 64 MiB; with the FlashInfer wheels (.whl, ~10 MiB)
# the tree is over it. `start` switches to a throwaway branch whose tree leaves out the run folders before the newest
# KEEP ones (they stay on main) and moves .whl/old_tb.tar aside; run the device call from it with
# KDBENCH_GIT_SHA=<main's sha>, then `end` switches back to main and deletes the branch.
# Tests that read a dropped folder (tests/test_h200_scripts.py) fail on that branch: run them from main.
# Usage (repo root, clean working tree): bash reports/h200/transport.sh start [KEEP=3] | end
set -euo pipefail
branch=device-transport
case "${1:-}" in
  start)
    keep=${2:-3}
    [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "transport: commit or stash first"; exit 1; }
    mapfile -t runs < <(git ls-files reports/h200 | sed -n 's#^\(reports/h200/20[0-9-]*[^/]*\)/.*#\1#p' | sort -uV)
    drop=("${runs[@]:0:$(( ${#runs[@]} > keep ? ${#runs[@]} - keep : 0 ))}")
    git switch -q -c "$branch"
    [ ${#drop[@]} -eq 0 ] || git rm -r -q "${drop[@]}"
    git commit -q --allow-empty -m "transport: without ${#drop[@]} older run folders (device carry limit)"
    [ ! -e .whl/old_tb.tar ] || mv .whl/old_tb.tar /tmp/kdb_old_tb.tar
    echo "transport: on $branch without ${drop[*]:-nothing}; tracked $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) B"
    ;;
  end)
    git switch -q main && git branch -D -q "$branch"
    [ ! -e /tmp/kdb_old_tb.tar ] || mv /tmp/kdb_old_tb.tar .whl/old_tb.tar
    echo "transport: back on main"
    ;;
  *) echo "usage: bash reports/h200/transport.sh start [KEEP] | end"; exit 2 ;;
esac
