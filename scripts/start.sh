#!/usr/bin/env bash
# `npm start`: make sure Node >= 22 and the dependencies are here, then serve on the embedded defaults.
set -euo pipefail
source "$(dirname "$0")/env.sh"
ensure_deps
exec node packages/cli/src/main.ts serve "$@"
