#!/usr/bin/env bash
# The code's lint (`npm run lint`, and a step of `npm test`): casts only in each package's reviewed
# casts.ts (biome.json, lint/casts.grit), no inline suppressions of those rules, no unused exports
# (knip.json), no import cycle, every package declaring what it imports. The checks run side by
# side (about 7 s of CPU in all); each one's output is printed in turn, and the exit status says
# whether any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bin=node_modules/.bin
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
names=()
check() {
  local n=${#names[@]}
  names+=("$1")
  shift
  ("$@" >"$out/$n" 2>&1; echo $? >"$out/$n.rc") &
}
no_suppressions() {
  # Biome honours inline biome-ignore comments: the cast rules must not be silenced that way.
  ! grep -rn --include='*.ts' "biome-ignore" packages/*/src test bench
}
check "casts (biome)" "$bin/biome" lint --max-diagnostics=none .
check "no inline suppressions" no_suppressions
check "unused exports (knip)" "$bin/knip" --no-progress
check "import cycles (dpdm)" "$bin/dpdm" --no-tree --no-warning --no-progress --exit-code circular:1 --exclude 'node_modules|/gen/' 'packages/*/src/**/*.ts'
check "package dependencies" node scripts/check-package-deps.ts
wait
failed=0
for n in "${!names[@]}"; do
  echo "-- ${names[$n]}"
  cat "$out/$n"
  [ "$(cat "$out/$n.rc")" -eq 0 ] || { echo "!! lint failed: ${names[$n]}"; failed=$((failed + 1)); }
done
[ "$failed" -eq 0 ]
