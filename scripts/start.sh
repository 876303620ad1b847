#!/usr/bin/env bash
# `npm start`: make sure Node >= 22, the dependencies and (as root) the host packages sandboxes
# need are here, then serve on the embedded defaults.
set -euo pipefail
source "$(dirname "$0")/env.sh"
source "$(dirname "$0")/host-packages.sh"
ensure_deps
# Without root the server still serves the API and answers sandbox calls with 503 and the reason.
if [ "$(id -u)" -eq 0 ]; then ensure_host_packages $SANDBOX_PACKAGES; fi
exec node packages/cli/src/main.ts serve "$@"
