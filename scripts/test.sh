#!/usr/bin/env bash
# `npm test`: contract lint and freshness, typecheck, the code's lint, then every suite (vitest),
# ending with one line of totals: "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/env.sh"
ensure_deps
failed_steps=0
step() {
  echo "== $1"
  shift
  "$@" || { echo "!! step failed: $*"; failed_steps=$((failed_steps + 1)); }
}
gen_is_fresh() {
  local tmp; tmp="$(mktemp -d)"
  npx buf generate -o "$tmp" && diff -r "$tmp/packages/protocol/gen" packages/protocol/gen >/dev/null
  local rc=$?; rm -rf "$tmp"
  [ $rc -eq 0 ] || echo "packages/protocol/gen is stale: run npm run generate"
  return $rc
}
step "buf lint" npx buf lint
step "generated code is fresh" gen_is_fresh
step "typecheck" npx tsc -p tsconfig.json --noEmit
# The code's lint (a few seconds in all): casts only in each package's reviewed casts.ts
# (biome.json, lint/casts.grit), no unused exports (knip.json), no import cycle, every package
# declaring what it imports.
no_suppressions() {
  # Biome honours inline biome-ignore comments: the cast rules must not be silenced that way.
  ! grep -rn --include='*.ts' "biome-ignore" packages/*/src test bench
}
step "lint: casts" node_modules/.bin/biome lint --max-diagnostics=none .
step "lint: no inline suppressions" no_suppressions
step "lint: unused exports" node_modules/.bin/knip --no-progress
step "lint: import cycles" node_modules/.bin/dpdm --no-tree --no-warning --no-progress --exit-code circular:1 --exclude 'node_modules|/gen/' 'packages/*/src/**/*.ts'
step "lint: package dependencies" node scripts/check-package-deps.ts
report="$(mktemp)"
echo "== vitest"
npx vitest run --reporter=default --reporter=json --outputFile.json="$report" "$@"
vitest_rc=$?
node -e '
  const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  const failed = r.numFailedTests + Number(process.argv[2]);
  console.log(`${r.numPassedTests} passed, ${failed} failed` + (r.numPendingTests ? `, ${r.numPendingTests} skipped` : ""));
' "$report" "$failed_steps" 2>/dev/null || echo "0 passed, $((failed_steps + 1)) failed"
rm -f "$report"
[ $vitest_rc -eq 0 ] && [ $failed_steps -eq 0 ]
