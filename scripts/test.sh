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
step "lint" bash scripts/lint.sh
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
