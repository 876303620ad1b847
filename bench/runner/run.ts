// Runner bench: the linux provider against the floor of the same mechanisms driven by a bare
// shell, measured in the same run on the same rootfs.  Run as root:  node bench/runner/run.ts
//
//   floor/true   mkdir + overlay mount + setpriv + bwrap (all namespaces) + /bin/true + umount + rm
//   floor/node   the same, with node and the agent stand-in bound in, until it listens on a unix socket
//   create→ready provider.create + provider.start (cgroups, mount points, agent socket accepting)
//   destroy      provider.destroy of a started sandbox (kill, unmount, remove everything)
//
// Each is run >= 50 times one after another, then >= 52 times with 4 at once (the three kinds
// interleaved). Results are printed and written to bench/runner/RESULTS.md.
import { spawn } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { StartPhase } from "../../packages/runner/src/linux/provider.ts";
import { execAgentBundle, fixture, uniqueId } from "../../packages/runner/src/linux/testing/harness.ts";

const RUNS = Number(process.env.BENCH_RUNS ?? 50);
const PARALLEL = 4;
const FLOOR_UID = 1_690_000_000;

if (process.getuid?.() !== 0) {
  console.error("bench/runner must run as root (it mounts, manages cgroups and starts sandboxes)");
  process.exit(1);
}

interface Stat {
  n: number;
  p50: number;
  p95: number;
  mean: number;
}

function stats(xs: number[]): Stat {
  const s = [...xs].sort((a, b) => a - b);
  const q = (p: number) => s[Math.min(s.length - 1, Math.ceil(p * s.length) - 1)];
  return { n: s.length, p50: q(0.5), p95: q(0.95), mean: s.reduce((a, b) => a + b, 0) / s.length };
}

async function sequential(runs: number, once: (i: number) => Promise<number>): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < runs; i++) out.push(await once(i));
  return out;
}

async function parallel(runs: number, once: (i: number) => Promise<number>): Promise<number[]> {
  const out: number[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: PARALLEL }, async () => {
      while (next < runs) out.push(await once(next++));
    }),
  );
  return out;
}

// ---- floor: the mechanisms driven by one shell script per run ------------------------------
// floor/node runs the same agent stand-in as the provider (exiting once it listens), so the ratio
// is the provider's own cost, not a difference in what node loads.

const FLOOR_SCRIPT = `set -e
D="$1"; LOWER="$2"; U="$3"; NODE="$4"; MODE="$5"; AGENT="$6"
mkdir -p "$D/upper" "$D/work" "$D/merged" "$D/run"
mount -t overlay overlay -o nosuid,nodev,lowerdir="$LOWER",upperdir="$D/upper",workdir="$D/work" "$D/merged"
set -- --unshare-user --unshare-all --as-pid-1 --new-session --cap-drop ALL --clearenv --setenv PATH /usr/bin:/bin \\
  --uid 1000 --gid 1000 --bind "$D/merged" / --ro-bind /usr /usr --proc /proc --dev /dev
if [ "$MODE" = node ]; then
  touch "$D/merged/opt/sandbar/bin/node" "$D/merged/opt/sandbar/agent/agent.mjs"; chown "$U" "$D/run"
  setpriv --reuid="$U" --regid="$U" --clear-groups --no-new-privs bwrap "$@" --ro-bind "$NODE" /opt/sandbar/bin/node \\
    --ro-bind "$AGENT" /opt/sandbar/agent/agent.mjs --bind "$D/run" /run/sandbar \\
    -- /opt/sandbar/bin/node /opt/sandbar/agent/agent.mjs --socket /run/sandbar/s.sock --exit-when-listening
else
  setpriv --reuid="$U" --regid="$U" --clear-groups --no-new-privs bwrap "$@" -- /bin/true
fi
umount "$D/merged"
rm -rf "$D"
`;

function floorOnce(workDir: string, lower: string, mode: "true" | "node", agent: string) {
  return (i: number) =>
    new Promise<number>((resolve, reject) => {
      const t0 = performance.now();
      const d = path.join(workDir, `${mode}-${i}-${Math.random().toString(36).slice(2, 8)}`);
      const child = spawn("/bin/sh", ["-c", FLOOR_SCRIPT, "floor", d, lower, String(FLOOR_UID + (i % 64)), process.execPath, mode, agent], {
        stdio: ["ignore", "ignore", "pipe"],
        env: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
      });
      let err = "";
      child.stderr.on("data", (c: Buffer) => (err += c.toString()));
      child.on("close", (code) => (code === 0 ? resolve(performance.now() - t0) : reject(new Error(`floor run failed (${code}): ${err}`))));
    });
}

// ---- provider ------------------------------------------------------------------------------

async function main(): Promise<void> {
  // Per-phase times of every start, kept for the sequential runs (where phases do not overlap).
  const phases = new Map<StartPhase, number[]>();
  let tracing = false;
  const f = await fixture({
    dataDir: await mkdtemp(path.join(os.tmpdir(), "sandbar-bench-")),
    trace: (_id, phase, ms) => {
      if (tracing) phases.set(phase, [...(phases.get(phase) ?? []), ms]);
    },
  });
  const workDir = path.join(f.provider.layout.runtimeDir, "floor");
  await mkdir(workDir, { recursive: true, mode: 0o711 });
  const agent = await execAgentBundle();
  const rows: [string, string, Stat][] = [];
  const record = (what: string, how: string, xs: number[]) => {
    const s = stats(xs);
    rows.push([what, how, s]);
    console.log(`${what.padEnd(14)} ${how.padEnd(12)} n=${s.n} p50=${s.p50.toFixed(1)} ms p95=${s.p95.toFixed(1)} ms mean=${s.mean.toFixed(1)} ms`);
  };

  // Warm caches (page cache, binaries) so the first runs do not skew the figures.
  for (let i = 0; i < 3; i++) {
    await floorOnce(workDir, f.rootfs, "node", agent)(i);
    const id = uniqueId("warm");
    await f.provider.create(f.spec(id));
    await f.provider.start(id);
    await f.provider.destroy(id);
  }

  const providerRun = (destroyTimes: number[]) => async () => {
    const id = uniqueId("bench");
    const t0 = performance.now();
    await f.provider.create(f.spec(id));
    await f.provider.start(id);
    const ready = performance.now() - t0;
    const t1 = performance.now();
    await f.provider.destroy(id);
    destroyTimes.push(performance.now() - t1);
    return ready;
  };

  // The three are interleaved run by run, so drifting load on a shared machine hits them alike.
  for (const [how, drive] of [
    ["sequential", sequential],
    [`${PARALLEL} parallel`, parallel],
  ] as const) {
    const runs = how === "sequential" ? RUNS : Math.ceil(RUNS / PARALLEL) * PARALLEL;
    tracing = how === "sequential";
    const floorTrue: number[] = [];
    const floorNode: number[] = [];
    const destroys: number[] = [];
    const ready = await drive(runs, async (i) => {
      floorTrue.push(await floorOnce(workDir, f.rootfs, "true", agent)(i));
      floorNode.push(await floorOnce(workDir, f.rootfs, "node", agent)(i));
      return providerRun(destroys)();
    });
    record("floor/true", how, floorTrue);
    record("floor/node", how, floorNode);
    record("create→ready", how, ready);
    record("destroy", how, destroys);
  }

  await rm(workDir, { recursive: true, force: true });
  await f.provider.close();
  await rm(f.dataDir, { recursive: true, force: true });

  const get = (what: string, how: string) => rows.find((r) => r[0] === what && r[1] === how)![2];
  const ratios = ["sequential", `${PARALLEL} parallel`].map((how) => {
    const ready = get("create→ready", how);
    const node = get("floor/node", how);
    const destroy = get("destroy", how);
    const floorTrue = get("floor/true", how);
    return `| ${how} | ${(ready.p50 / node.p50).toFixed(2)}× | ${(ready.p95 / node.p95).toFixed(2)}× | ${((ready.p50 + destroy.p50) / node.p50).toFixed(2)}× | ${(destroy.p50 / floorTrue.p50).toFixed(2)}× |`;
  });
  const phaseRows = [...phases].map(([phase, xs]) => {
    const st = stats(xs);
    return `| ${phase} | ${st.p50.toFixed(1)} | ${st.p95.toFixed(1)} |`;
  });
  const table = rows.map(([what, how, s]) => `| ${what} | ${how} | ${s.n} | ${s.p50.toFixed(1)} | ${s.p95.toFixed(1)} | ${s.mean.toFixed(1)} |`);
  const md = `# Runner bench: linux provider vs. floor

Latest run: ${new Date().toISOString()} on ${os.cpus().length} × ${os.cpus()[0]?.model ?? "cpu"}, ${Math.round(os.totalmem() / 2 ** 30)} GiB,
kernel ${os.release()}, node ${process.version}; load average at the end ${os.loadavg().map((l) => l.toFixed(2)).join(" / ")}
(the machine is shared: other work running at the same time shows up as noise).

Command: \`node bench/runner/run.ts\` (as root; \`BENCH_RUNS\` sets the sequential run count, default 50).
Rootfs: the host-/usr snapshot (\`buildHostUsrRootfs\`), the same lower layer for floor and provider.
Runs of the four kinds are interleaved (floor/true, floor/node, create→ready, destroy, repeat), so load
drifting on the machine hits them alike; the ratios are the figures to compare.

- **floor/true**: one shell script: mkdir, overlay mount, \`setpriv\` to a sandbox uid, \`bwrap\` with all
  namespaces, \`/bin/true\`, umount, rm. Timed from spawning the script to its exit.
- **floor/node**: the same with the host's node and the agent stand-in bound in, run until the agent
  listens on a unix socket in a bound directory (it exits right then).
- **create→ready**: \`provider.create\` + \`provider.start\`: record, per-sandbox uid, overlay, mount points,
  home and passwd entry, cgroup (memory, pids, cpu) joined before exec, \`setpriv\` + \`bwrap\`, the agent
  stand-in (\`exec-agent\`, plain JS) accepting connections on its socket.
- **destroy**: \`provider.destroy\` of that started sandbox: SIGKILL of the namespace, reaping, cgroup
  removal, unmount, directory removal.

| what | how | runs | p50 ms | p95 ms | mean ms |
|---|---|---|---|---|---|
${table.join("\n")}

Ratios against the floor measured in the same run:

| how | create→ready / floor/node (p50) | (p95) | create→ready+destroy / floor/node (p50) | destroy / floor/true (p50) |
|---|---|---|---|---|
${ratios.join("\n")}

Where a sequential start spends its time (provider trace hook; \`socket\` = launcher spawned until the
agent's socket accepts, i.e. sh + setpriv + bwrap + pid-1 shell + node start-up + listen):

| phase | p50 ms | p95 ms |
|---|---|---|
${phaseRows.join("\n")}
`;
  const out = path.join(path.dirname(fileURLToPath(import.meta.url)), "RESULTS.md");
  await writeFile(out, md);
  console.log(`\n${ratios.join("\n")}\nwritten to ${out}`);
}

await main();
