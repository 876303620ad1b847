#!/bin/sh
# A runner of the docker-compose fleet: waits for fleet-init's region and key, then registers
# itself with control (through the load balancer) on its first start; later starts reuse the
# credential hash kept in its data dir.
set -eu
for i in $(seq 1 120); do
  [ -s /fleet/region ] && [ -s /fleet/runner-registration-key ] && break
  sleep 1
done
SANDBAR_RUNNER_REGION=$(cat /fleet/region)
SANDBAR_RUNNER_REGISTRATION_KEY=$(cat /fleet/runner-registration-key)
export SANDBAR_RUNNER_REGION SANDBAR_RUNNER_REGISTRATION_KEY
exec node /app/packages/cli/src/main.ts runner
