// The sandbox's pid 1: a POSIX shell that supervises the agent.
//
//   sh -c INIT_SCRIPT sandbar-init <restarts file> <delays> <max quick deaths> <agent command...>
//
// - Reaps orphans: while it waits for the agent, dash's `wait` collects any child. (bwrap's own
//   reaper is not used (--as-pid-1): when the agent exits it reports and quits before reaping its
//   init, orphaning it to the host's pid 1, which on some hosts reaps only every few seconds.)
// - Restarts the agent when it dies (user code can kill it: it runs as the same uid), after the
//   n-th of <delays> (seconds; the last one repeats) for the n-th quick death in a row; an agent
//   that ran 30 s or more starts the count again. After <max> quick deaths in a row it gives up
//   and exits with the agent's status, which ends the sandbox (state `error`, restartable).
// - Forwards SIGTERM (and INT, HUP) to the agent and exits once the agent has: a stop is graceful.
// - Counts restarts in the file given first ("<restarts> <last exit status>", read by the provider
//   for SandboxInfo and while it waits for the socket) and tells the agent it is a restart
//   through SANDBAR_AGENT_RESTARTS.
// `read ... </proc/uptime` gives a clock without forking.

/** Between consecutive quick deaths: 0.1, 0.5, 1, 2, then 5 s (about 35 s to give up). */
const RESTART_DELAYS = [0.1, 0.5, 1, 2, 5];
const MAX_QUICK_DEATHS = 10;
const QUICK_DEATH_SECONDS = 30;

/** The init's arguments before the agent's command. */
export function initArgs(restartsFile: string, delays = RESTART_DELAYS, maxQuickDeaths = MAX_QUICK_DEATHS): string[] {
  return ["sandbar-init", restartsFile, delays.join(" "), String(maxQuickDeaths)];
}

export const INIT_SCRIPT = `f=$1 delays=$2 max=$3; shift 3
n=0; quick=0; a=; term=
trap 'term=1; [ -z "$a" ] || kill -TERM "$a" 2>/dev/null' TERM INT HUP
while :; do
  read t0 _ </proc/uptime || t0=0
  SANDBAR_AGENT_RESTARTS=$n "$@" & a=$!
  while :; do
    wait "$a"; st=$?
    [ "$st" -gt 128 ] && kill -0 "$a" 2>/dev/null || break
  done
  a=
  [ -z "$term" ] || exit "$st"
  read t1 _ </proc/uptime || t1=0
  if [ $(( \${t1%.*} - \${t0%.*} )) -ge ${QUICK_DEATH_SECONDS} ]; then quick=1; else quick=$((quick + 1)); fi
  n=$((n + 1))
  echo "$n $st" >"$f"
  if [ "$quick" -gt "$max" ]; then
    echo "sandbar-init: the agent died $quick times in a row (last status $st); giving up" >&2
    exit "$st"
  fi
  i=0
  for d in $delays; do i=$((i + 1)); [ "$i" -lt "$quick" ] || break; done
  echo "sandbar-init: the agent exited with $st; restart $n in \${d}s" >&2
  sleep "$d" & w=$!
  wait "$w"
  [ -z "$term" ] || exit "$st"
done`;
