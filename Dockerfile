# The Sandbar image: control (`serve`, the default command), a runner (`runner`) and the fleet's
# load balancer (Debian's haproxy, deploy/haproxy.cfg). docker-compose.yml runs them all.
# BASE: any Debian bookworm with node 24 on the PATH (scripts/image-smoke.sh builds one offline);
# NODEDIR: where its headers are (native modules such as node-pty build against them, offline).
ARG BASE=node:24-bookworm-slim

# Dependencies, with the toolchain native modules need; only node_modules leaves this stage.
FROM ${BASE} AS deps
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
COPY packages ./packages
COPY proto ./proto
ARG NODEDIR=/usr/local
RUN npm_config_nodedir=$NODEDIR npm ci --omit=dev --no-audit --no-fund

FROM ${BASE}
# What a sandbox host needs (the one list, scripts/host-packages.sh), and haproxy.
COPY scripts/host-packages.sh /tmp/host-packages.sh
RUN . /tmp/host-packages.sh && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $SANDBOX_PACKAGES haproxy ca-certificates \
 && rm -rf /var/lib/apt/lists/* /tmp/host-packages.sh
WORKDIR /app
COPY --from=deps /app /app
COPY . .
ENV SANDBAR_PORT=3000 SANDBAR_DATA_DIR=/var/lib/sandbar
EXPOSE 3000 3100
CMD ["node", "packages/cli/src/main.ts", "serve"]
