# Sourced by the start script and CI: the Debian/Ubuntu packages a sandbox host needs, and the
# ones only the test suites need. One list, so `npm start` and CI never drift apart.
# bubblewrap, util-linux (setpriv), mount, e2fsprogs (disk caps): isolation; debootstrap: the default
# snapshot; git, python3-pylsp: the agent's git and Python language server; python3-seccomp: the
# sandbox seccomp filter; procps, iproute2, tar: process, network and layer tools; buildah: declarative
# builds; docker-registry, openssl: the internal registry and its token-signing certificate.
SANDBOX_PACKAGES="bubblewrap util-linux mount e2fsprogs debootstrap git python3-pylsp python3-seccomp procps iproute2 nftables tar skopeo attr buildah docker-registry openssl"
# Test-only: a real browser for the sign-in flow; htpasswd for the test registry's basic auth;
# a Docker engine and gVisor for the docker provider's suites (their setup starts dockerd itself);
# tmux: the CLI driven in a real terminal; docker-compose, haproxy: the fleet's compose file and load balancer (test/fleet);
# curl: a client of its own for transfers and REST over h2c (prior knowledge and Upgrade).
TEST_PACKAGES="chromium apache2-utils docker.io runsc tmux docker-compose haproxy curl"

# Installs whichever of "$@" is missing. As root with apt-get: installs; otherwise prints the
# exact command to run and fails.
ensure_host_packages() {
  local missing
  missing=$(for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done | tr '\n' ' ')
  [ -z "${missing// }" ] && return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "sandbar: this host lacks packages sandboxes need ($missing) and has no apt-get; install their equivalents" >&2
    return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "sandbar: missing host packages; run: sudo apt-get install -y --no-install-recommends $missing" >&2
    return 1
  fi
  echo "sandbar: installing host packages: $missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null; } >&2 || {
    echo "sandbar: apt-get install failed; run: apt-get update && apt-get install -y --no-install-recommends $missing" >&2
    return 1
  }
}
