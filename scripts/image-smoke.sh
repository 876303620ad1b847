#!/bin/bash
# Builds the Sandbar image on a local Docker engine with no public registry, then checks what it
# holds. Not part of `npm test` (a few minutes: Debian packages and npm ci inside the build).
# The base image is made offline: the default snapshot's Debian bookworm root (the shared cache,
# read only) imported with `docker import`, plus this checkout's node 24 (.tools). RUN steps use
# the host's network (Debian's archive and npm's registry, as `npm start` would).
# Usage (as root): scripts/image-smoke.sh   — starts its own dockerd, stops it at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
CACHE=${SANDBAR_TEST_CACHE_DIR:-/var/tmp/sandbar-runner-test-cache}
ROOTFS=$(ls -d "$CACHE"/snapshots/debian-bookworm-*/rootfs | head -1)
NODE_DIR=$(dirname "$(dirname "$(readlink -f "$(command -v node)")")")
WORK=$(mktemp -d /var/tmp/sandbar-image-smoke-XXXXXX)
export WORK
cleanup() {
  node -e "import('./packages/runner/src/docker/testing/dockerd.ts').then((m) => m.stopDockerd(process.env.WORK))" || true
}
trap cleanup EXIT
SOCK=$(node -e "import('./packages/runner/src/docker/testing/dockerd.ts').then(async (m) => console.log((await m.startDockerd(process.env.WORK)).socketPath))")
export DOCKER_HOST=unix://$SOCK
t0=$(date +%s)
echo "== base image: $ROOTFS + node $(node --version)"
tar -C "$ROOTFS" -c . | docker import - sandbar-smoke-debian:bookworm >/dev/null
mkdir -p "$WORK/base"
cp -a "$NODE_DIR" "$WORK/base/node"
# npm: the host's (the .tools node comes without one).
NPM_DIR=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
mkdir -p "$WORK/base/node/lib/node_modules" && cp -a "$NPM_DIR" "$WORK/base/node/lib/node_modules/npm"
ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$WORK/base/node/bin/npm"
# Headers for native modules (node-pty uses N-API, so any recent node's headers do): the host's,
# since nodejs.org may not be reachable.
if [ ! -e "$WORK/base/node/include/node/node_api.h" ]; then
  mkdir -p "$WORK/base/node/include" && cp -a /usr/include/node "$WORK/base/node/include/node"
fi
# This host's extra CAs (a TLS-inspecting egress proxy, if any): RUN steps reach npm's registry
# through the same egress as the host, and apt's ca-certificates keeps them when it rebuilds the bundle.
mkdir -p "$WORK/base/ca" && cp /usr/local/share/ca-certificates/*.crt "$WORK/base/ca/" 2>/dev/null || true
cp /etc/ssl/certs/ca-certificates.crt "$WORK/base/ca-bundle.crt"
cat > "$WORK/base/Dockerfile" <<'DOCKERFILE'
FROM sandbar-smoke-debian:bookworm
COPY node /usr/local/node
COPY ca/ /usr/local/share/ca-certificates/
COPY ca-bundle.crt /etc/ssl/certs/ca-certificates.crt
ENV PATH=/usr/local/node/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
DOCKERFILE
docker build -q --network host -t sandbar-smoke-base "$WORK/base" >/dev/null
echo "== docker build (BASE=sandbar-smoke-base)"
BUILD_LOG=${BUILD_LOG:-/tmp/sandbar-image-build.log}
docker build --network host --build-arg BASE=sandbar-smoke-base --build-arg NODEDIR=/usr/local/node -t sandbar:local . >"$BUILD_LOG" 2>&1 || { tail -40 "$BUILD_LOG"; exit 1; }
t1=$(date +%s)
echo "== built in $((t1 - t0)) s: $(docker image inspect sandbar:local --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}')"
run() { docker run --rm --network host "$@"; }
echo "== the CLI"; run sandbar:local node packages/cli/src/main.ts --help | head -3
echo "== haproxy and the fleet's config"
run -e LISTEN=127.0.0.1:3999 -e CONTROL_1=127.0.0.1:1 -e CONTROL_2=127.0.0.1:2 --entrypoint haproxy sandbar:local -c -f /app/deploy/haproxy.cfg
echo "== host packages in the image"
run --entrypoint sh sandbar:local -c '. /app/scripts/host-packages.sh; for p in $SANDBOX_PACKAGES haproxy; do dpkg -s $p >/dev/null 2>&1 || { echo "missing $p"; exit 1; }; done; echo all present'
echo "== control in the image (embedded PostgreSQL), answering REST"
KEY=sbr_$(openssl rand -hex 32)
PORT=$(node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")
CID=$(docker run -d --network host -e SANDBAR_PORT="$PORT" -e SANDBAR_HOST=127.0.0.1 -e SANDBAR_BOOTSTRAP_API_KEY="$KEY" -e SANDBAR_WARM_POOL=0 -e SANDBAR_INTERNAL_REGISTRY=off sandbar:local)
for i in $(seq 1 90); do curl -sf -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT/api/api-keys/current" >/dev/null && break; sleep 1; done
curl -sf -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT/api/api-keys/current" | head -c 200; echo
docker logs "$CID" 2>&1 | tail -5
docker rm -f "$CID" >/dev/null
echo "== image checks passed in $(($(date +%s) - t0)) s"

# The fleet of docker-compose.yml, unchanged but for PostgreSQL's image (postgres:17 cannot be
# pulled here): one made from Debian's postgresql-15 with the same POSTGRES_* contract.
echo "== the compose fleet"
mkdir -p "$WORK/pg"
cat > "$WORK/pg/entrypoint.sh" <<'SH'
#!/bin/sh
set -e
D=/var/lib/postgresql/data
mkdir -p "$D" /var/run/postgresql && chown postgres:postgres "$D" /var/run/postgresql && chmod 700 "$D"
if [ ! -s "$D/PG_VERSION" ]; then
  printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pw && chown postgres /tmp/pw
  setpriv --reuid=postgres --regid=postgres --init-groups initdb -D "$D" -U "$POSTGRES_USER" --pwfile=/tmp/pw --auth-host=scram-sha-256 --auth-local=trust >/dev/null
  rm /tmp/pw
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$D/pg_hba.conf"
  echo "create database \"$POSTGRES_DB\" owner \"$POSTGRES_USER\"" | setpriv --reuid=postgres --regid=postgres --init-groups postgres --single -D "$D" postgres >/dev/null
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$D" -c listen_addresses='*'
SH
chmod +x "$WORK/pg/entrypoint.sh"
cat > "$WORK/pg/Dockerfile" <<'DOCKERFILE'
FROM sandbar-smoke-base
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/node/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY entrypoint.sh /entrypoint.sh
ENTRYPOINT ["/entrypoint.sh"]
DOCKERFILE
docker build -q --network host -t sandbar-smoke-postgres "$WORK/pg" >/dev/null
export SANDBAR_POSTGRES_IMAGE=sandbar-smoke-postgres SANDBAR_BOOTSTRAP_API_KEY="$KEY" COMPOSE_PROJECT_NAME=sandbarsmoke
FILES=(-f docker-compose.yml)
# Where privileged containers cannot start (this host may itself be a restricted container: runc
# then fails with "unable to apply caps"), the runners run unprivileged: they still register and
# answer health checks, and report that they cannot run sandboxes.
if ! docker run --rm --privileged --entrypoint true sandbar:local 2>/dev/null; then
  echo "(privileged containers cannot start on this host: the runners run unprivileged)"
  printf 'services:\n  runner-1:\n    privileged: false\n  runner-2:\n    privileged: false\n' > "$WORK/unprivileged.yml"
  FILES+=(-f "$WORK/unprivileged.yml")
fi
compose() { docker-compose "${FILES[@]}" "$@"; }
fleet_down() { compose down -v --remove-orphans >/dev/null 2>&1 || true; }
trap 'fleet_down; cleanup' EXIT
compose up -d --no-build 2>&1 | grep -v "^Creating\|^Pulling" || true
# Through the load balancer, from inside the fleet's network (no port of this host is used).
api() { compose exec -T control-1 node -e "fetch('http://lb:3000/api' + process.argv[1], { headers: { authorization: 'Bearer ' + process.env.SANDBAR_BOOTSTRAP_API_KEY } }).then(async (r) => { console.log(r.status, await r.text()); })" "$1"; }
for i in $(seq 1 120); do api /runners 2>/dev/null | grep -q '"runner-2"' && api /runners | grep -q '"runner-1"' && break; sleep 2; done
# Then control's health checks reach each runner at its advertised address (ready, or unresponsive with its reason).
for i in $(seq 1 60); do api /runners 2>/dev/null | grep -q '"initializing"' || break; sleep 2; done
compose ps
echo "-- GET /api/runners through the load balancer:"
api /runners | node -e "let s='';process.stdin.on('data',c=>s+=c).on('end',()=>{const [code,...rest]=s.split(' ');const rows=JSON.parse(rest.join(' '));console.log(code, rows.map(r=>({name:r.name,state:r.state,apiUrl:r.apiUrl??r.domain,cpu:r.cpu,memory:r.memory,reason:r.unresponsiveReason??r.reason})));})"
echo "-- haproxy's log (connections per replica):"
compose logs --no-color lb | grep -o 'control/control-[12]' | sort | uniq -c
echo "-- the runners' logs:"
compose logs --no-color runner-1 runner-2 | tail -20
api /runners | grep -q '"runner-1"' && api /runners | grep -q '"runner-2"' || { echo "the runners did not register"; compose logs --no-color | tail -60; exit 1; }
# A sandbox in the runners' region: reported as it ends, not required (a runner needs what this
# host may not give a container: privileges, and egress for the default snapshot's debootstrap).
echo "-- POST /api/sandbox {target: fleet} through the load balancer:"
compose exec -T control-2 node -e "fetch('http://lb:3000/api/sandbox', { method: 'POST', headers: { authorization: 'Bearer ' + process.env.SANDBAR_BOOTSTRAP_API_KEY, 'content-type': 'application/json' }, body: JSON.stringify({ target: 'fleet' }) }).then(async (r) => { const b = await r.json(); console.log(r.status, b.state ?? '', b.runnerId ?? '', b.message ?? b.errorReason ?? ''); })" || true
echo "== image and fleet smoke passed in $(($(date +%s) - t0)) s"
