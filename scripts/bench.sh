#!/usr/bin/env bash
# `npm run bench [name…]`: every benchmark under bench/ (or the named ones); each prints its figures
# with ratios against a floor measured in the same run and records them in bench/<name>/RESULTS.md.
set -euo pipefail
source "$(dirname "$0")/env.sh"
ensure_deps
names=("$@")
[ ${#names[@]} -gt 0 ] || names=($(for d in bench/*/run.ts; do basename "$(dirname "$d")"; done))
for name in "${names[@]}"; do
  # run.ts, then the bench's other entry points (run-<part>.ts), each writing its own results.
  for entry in "bench/$name/run.ts" bench/"$name"/run-*.ts; do
    [ -e "$entry" ] || continue
    echo "== $entry"
    node "$entry"
  done
done
