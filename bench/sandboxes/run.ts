// Sandboxes bench: time to interactive through the REST API (create, then the first exec returns)
// against the floor of the same mechanisms measured in the same run, `docker run --rm` when an
// engine answers, and density (idle sandboxes started until half the memory is used or 300 run).
//
//   node bench/sandboxes/run.ts [--quick]     (as root; writes bench/sandboxes/RESULTS.md)
//   node bench/sandboxes/run.ts --docker-only (the Docker rows alone, printed; writes nothing)
//   node bench/sandboxes/run.ts --agent-ab <bundle dir> [--quick]
//                                             (cold create→exec, sequential, interleaved between the agent
//                                             bundled fresh and another bundle, e.g. one built from an older
//                                             commit; two servers; printed, writes nothing)
//
// --quick: 12 sequential / 12 parallel runs and a density cap of 40 (to check the bench works).
import { spawn } from "node:child_process";
import { chmod, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { execAgentBundle } from "../../packages/runner/src/linux/testing/harness.ts";
import { TEST_SNAPSHOT_CACHE } from "../../packages/control/src/testing/server.ts";
import type { LocalRuntime } from "../../packages/control/src/sandboxes/local-runtime.ts";
import { loadAvg, log, machine, ms, pool, requireRoot, startBenchServer, stats, type BenchServer, type Stat } from "./support.ts";
import { benchEngine, type BenchEngine } from "./docker.ts";

requireRoot("bench/sandboxes");
const QUICK = process.argv.includes("--quick");
const RUNS = QUICK ? 12 : 50;
const PARALLEL = 4;
const DENSITY_TARGET = QUICK ? 40 : 300;
const DENSITY_CAP = QUICK ? 40 : 320;
const FLOOR_UID = 1_690_500_000;

// ---- floor: overlay + setpriv + bwrap, as bench/runner drives it, over the default snapshot ----
const FLOOR_SCRIPT = `set -e
D="$1"; LOWER="$2"; U="$3"; NODE="$4"; MODE="$5"; AGENT="$6"
mkdir -p "$D/upper" "$D/work" "$D/merged" "$D/run"
mount -t overlay overlay -o nosuid,nodev,lowerdir="$LOWER",upperdir="$D/upper",workdir="$D/work" "$D/merged"
set -- --unshare-user --unshare-all --as-pid-1 --new-session --cap-drop ALL --clearenv --setenv PATH /usr/bin:/bin \\
  --uid 1000 --gid 1000 --bind "$D/merged" / --proc /proc --dev /dev
if [ "$MODE" = node ]; then
  mkdir -p "$D/merged/opt/sandbar/bin" "$D/merged/opt/sandbar/agent" "$D/merged/run/sandbar"
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

function floorOnce(workDir: string, lower: string, mode: "true" | "node", agent: string, i: number): Promise<number> {
  return new Promise((resolve, reject) => {
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

/** The default snapshot's rootfs in the shared test cache (the lower layer sandboxes get). */
async function snapshotRootfs(): Promise<string> {
  const dir = path.join(TEST_SNAPSHOT_CACHE, "snapshots");
  const names = (await readdir(dir)).filter((n) => /^debian-bookworm-[0-9a-f]+$/.test(n));
  if (names.length === 0) throw new Error(`no built default snapshot under ${dir}`);
  return path.join(dir, names[0], "rootfs");
}

// ---- sandbar --------------------------------------------------------------------------------
/** Create→first exec; the two halves go to `split` when given (where the time goes). */
/** Cold creates ask for a shape the warm pool does not hold (memory 2 GiB); warm ones for the pool's (the default). */
const COLD = { memory: 2 };
const WARM = {};

async function tti(s: BenchServer, created: string[], split?: { create: number[]; exec: number[] }, body: object = COLD): Promise<number> {
  const t0 = performance.now();
  const sb = await s.rest.ok("POST", "/sandbox", body);
  const t1 = performance.now();
  const r = await s.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: "true" });
  const t = performance.now() - t0;
  split?.create.push(t1 - t0);
  split?.exec.push(t - (t1 - t0));
  if (r.exitCode !== 0) throw new Error(`exec in a new sandbox exited ${r.exitCode}: ${r.result}`);
  created.push(sb.id);
  return t;
}

async function deleteAll(s: BenchServer, ids: string[], width = 4): Promise<number[]> {
  const todo = [...ids];
  ids.length = 0;
  return pool(todo.length, width, async (i) => {
    const t0 = performance.now();
    await s.rest.ok("DELETE", `/sandbox/${todo[i]}`);
    return performance.now() - t0;
  });
}

async function memAvailable(): Promise<number> {
  const m = /MemAvailable:\s+(\d+) kB/.exec(await readFile("/proc/meminfo", "utf8"));
  return Number(m![1]) * 1024;
}

/** Processes in this server's sandbox cgroups and mounts under its runtime dir. */
async function leftovers(runtimeDir: string, cgroupName: string): Promise<{ processes: number; mounts: number }> {
  let processes = 0;
  for (const pid of await readdir("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    const cg = await readFile(`/proc/${pid}/cgroup`, "utf8").catch(() => "");
    if (cg.includes(`/${cgroupName}/`)) processes++;
  }
  const mounts = (await readFile("/proc/self/mountinfo", "utf8")).split("\n").filter((l) => l.includes(runtimeDir)).length;
  return { processes, mounts };
}

async function sleep(msec: number) {
  await new Promise((r) => setTimeout(r, msec));
}

async function main(): Promise<void> {
  const startedAt = new Date();
  log("building the agent and starting the control server");
  const s = await startBenchServer({ warmPool: PARALLEL });
  const warmPool = s.server.server.sandboxes.manager.pools!.default!;
  /** Waits (untimed) until the pool is full again: warm runs measure a claim, not a refill. */
  const poolFull = async () => {
    while (warmPool.stats().ready < PARALLEL) await sleep(20);
  };
  const lower = await snapshotRootfs();
  const agent = await execAgentBundle();
  const workDir = await mkdtemp(path.join("/var/tmp", "sandbar-bench-floor-"));
  await chmod(workDir, 0o711);
  const docker = await benchEngine(lower, log).catch((err: unknown) => {
    log(`docker rows skipped: ${err instanceof Error ? err.message.split("\n")[0] : String(err)}`);
    return undefined;
  });
  const image = docker?.image;
  const created: string[] = [];
  const rows: [string, string, Stat][] = [];
  /** Where a cold sequential create's host start goes (the provider's phases). */
  const profile: [string, Stat][] = [];
  const provider = (s.server.server.sandboxes.runtime as LocalRuntime).provider;
  const record = (what: string, how: string, xs: number[]) => {
    const st = stats(xs);
    rows.push([what, how, st]);
    console.log(`${what.padEnd(22)} ${how.padEnd(11)} n=${st.n} p50=${ms(st.p50)} ms p95=${ms(st.p95)} ms mean=${ms(st.mean)} ms`);
  };

  try {
    // Where this server's sandboxes live (for the leftover check) from one warm-up sandbox.
    for (let i = 0; i < 3; i++) {
      await tti(s, created);
      await floorOnce(workDir, lower, "node", agent, i);
      await floorOnce(workDir, lower, "true", agent, i);
    }
    const first = await s.server.server.sandboxes.manager.agentFor((await s.rest.ok("GET", `/sandbox/${created[0]}`)).organizationId, created[0]);
    const runtimeDir = first.key.split("/").slice(0, 4).join("/");
    const cgroupName = `sandbar-${path.basename(runtimeDir)}`;
    await deleteAll(s, created);

    for (const [how, width] of [
      ["sequential", 1],
      [`${PARALLEL} parallel`, PARALLEL],
    ] as const) {
      const runs = Math.ceil(RUNS / width) * width;
      const floorTrue: number[] = [];
      const floorNode: number[] = [];
      const dockerRuns: number[] = [];
      const dockerProvider: number[] = [];
      const split = { create: [] as number[], exec: [] as number[] };
      const phases = new Map<string, number[]>();
      provider.trace = (_id, phase, t) => void (phases.get(phase) ?? phases.set(phase, []).get(phase)!).push(t);
      log(`time to interactive, ${how}: ${runs} runs (interleaved with the floors${image ? " and docker" : ""})`);
      const ttis = await pool(runs, width, async (i) => {
        floorTrue.push(await floorOnce(workDir, lower, "true", agent, i));
        floorNode.push(await floorOnce(workDir, lower, "node", agent, i));
        if (docker) {
          dockerRuns.push(await docker.dockerRun());
          dockerProvider.push(await docker.providerTti(i));
        }
        return tti(s, created, split);
      });
      record("floor/true", how, floorTrue);
      record("floor/node", how, floorNode);
      if (docker) record(`docker run --rm`, how, dockerRuns);
      if (docker) record("docker provider", how, dockerProvider);
      record("REST create→exec", how, ttis);
      record("  of which create", how, split.create);
      record("  of which 1st exec", how, split.exec);
      record("REST delete", how, await deleteAll(s, created, width));
      provider.trace = () => undefined;
      if (width === 1) profile.push(...[...phases].map(([phase, xs]): [string, Stat] => [phase, stats(xs)]));
    }

    // ---- warm: creates the pool serves ----
    for (const [how, width] of [
      ["sequential", 1],
      [`${PARALLEL} parallel`, PARALLEL],
    ] as const) {
      const runs = Math.ceil(RUNS / width) * width;
      const split = { create: [] as number[], exec: [] as number[] };
      const ttis: number[] = [];
      const refills: number[] = [];
      log(`time to interactive from the warm pool, ${how}: ${runs} runs`);
      for (let i = 0; i < runs; i += width) {
        await poolFull();
        ttis.push(...(await pool(width, width, () => tti(s, created, split, WARM))));
        const t = performance.now();
        await poolFull();
        refills.push((performance.now() - t) / width);
      }
      record("warm create→exec", how, ttis);
      record("  of which create", `${how} warm`, split.create);
      record("  of which 1st exec", `${how} warm`, split.exec);
      record("pool refill per sandbox", how, refills);
      await deleteAll(s, created, width);
    }

    // ---- density ----
    await sleep(2000);
    const total = os.totalmem();
    const before = await memAvailable();
    const budget = total / 2;
    log(`density: starting idle sandboxes (memory 1 GiB) until ${(budget / 2 ** 30).toFixed(1)} GiB in use or ${DENSITY_TARGET} run`);
    const startTimes: number[] = [];
    let stopReason = `${DENSITY_TARGET} running`;
    let failure = "";
    const t0 = performance.now();
    while (created.length < DENSITY_CAP) {
      if (total - (await memAvailable()) >= budget) {
        stopReason = "half the memory in use";
        break;
      }
      if (created.length >= DENSITY_TARGET) break;
      const t = performance.now();
      try {
        const sb = await s.rest.ok("POST", "/sandbox", { memory: 1 });
        created.push(sb.id);
      } catch (err) {
        failure = err instanceof Error ? err.message : String(err);
        stopReason = `a create failed: ${failure.slice(0, 200)}`;
        break;
      }
      startTimes.push(performance.now() - t);
      if (created.length % 50 === 0) log(`  ${created.length} running, MemAvailable ${((await memAvailable()) / 2 ** 30).toFixed(2)} GiB`);
    }
    const fillSeconds = (performance.now() - t0) / 1000;
    await sleep(3000); // let the agents settle into idle before reading memory
    const after = await memAvailable();
    const count = created.length;
    // Every one still answers: the count is of working sandboxes, not of records.
    let answering = 0;
    await pool(count, 8, async (i) => {
      const r = await s.rest.call("POST", `/toolbox/${created[i]}/toolbox/process/execute`, { command: "true" });
      if (r.status === 200 && r.body?.exitCode === 0) answering++;
      return 0;
    });
    const perSandbox = (before - after) / count;
    log(`density: ${count} running (${answering} answering exec), ${(perSandbox / 2 ** 20).toFixed(1)} MiB each`);
    const tDel = performance.now();
    const deleteTimes = await deleteAll(s, created, 4);
    const deleteSeconds = (performance.now() - tDel) / 1000;
    await warmPool.close(); // its sandboxes have no row: removed here, so the leftover check sees only what deletes left
    await sleep(2000);
    const left = await leftovers(runtimeDir, cgroupName);
    const start = stats(startTimes);
    const del = stats(deleteTimes);
    log(`density: deleted in ${deleteSeconds.toFixed(1)} s; left: ${left.processes} processes, ${left.mounts} mounts`);

    // ---- report ----
    const get = (what: string, how: string) => rows.find((r) => r[0] === what && r[1] === how)?.[2];
    const ratio = (how: string) => {
      const t = get("REST create→exec", how)!;
      const node = get("floor/node", how)!;
      const d = get("docker run --rm", how);
      const w = get("warm create→exec", how)!;
      return [
        `| cold, ${how} | ${ms(t.p50)} | ${(t.p50 / node.p50).toFixed(2)}× | ${(t.p95 / node.p95).toFixed(2)}× | ${d ? `${(t.p50 / d.p50).toFixed(2)}×` : "n/a"} | ≤ 60 ms: ${t.p50 <= 60 ? "met" : "missed"} |`,
        `| warm pool, ${how} | ${ms(w.p50)} | ${(w.p50 / node.p50).toFixed(2)}× | ${(w.p95 / node.p95).toFixed(2)}× | ${d ? `${(w.p50 / d.p50).toFixed(2)}×` : "n/a"} | ≤ 15 ms: ${w.p50 <= 15 ? "met" : "missed"} |`,
      ].join("\n");
    };
    const table = rows.map(([what, how, st]) => `| ${what} | ${how} | ${st.n} | ${ms(st.p50)} | ${ms(st.p95)} | ${ms(st.mean)} |`);
    const md = `# Sandboxes bench: time to interactive and density

Latest run: ${startedAt.toISOString()}${QUICK ? " (**--quick**: fewer runs, density capped at 40)" : ""} on ${machine()};
load average at the end ${loadAvg()} (the machine is shared: other work running at the same time shows up as noise).

Command: \`node bench/sandboxes/run.ts\` (as root). One real control server (\`startTestServer\`, embedded
PostgreSQL, the default snapshot from the shared test cache, the agent bundled fresh as test/sdk does).
Runs of each kind are interleaved (floor/true, floor/node, ${image ? "docker, " : ""}REST create→exec, repeat), so load
drifting on the machine hits them alike.

- **floor/true**: one shell script as bench/runner has it, over the default snapshot's rootfs: mkdir,
  overlay mount, \`setpriv\` to a sandbox uid, \`bwrap\` with all namespaces, \`/bin/true\`, umount, rm.
- **floor/node**: the same with node and the agent stand-in bound in, until it listens on a unix socket.
- **REST create→exec** (cold): \`POST /api/sandbox {"memory": 2}\` (default snapshot; a shape the warm pool
  does not hold, so the sandbox is made for the request) then the first
  \`POST /api/toolbox/{id}/toolbox/process/execute {"command":"true"}\` returns (HTTP/1.1 keep-alive).
- **warm create→exec**: the same with \`POST /api/sandbox {}\`, served by the server's warm pool (${PARALLEL}
  sandboxes, \`SANDBAR_WARM_POOL\`): the create claims a started, warmed sandbox. Before each run (each batch of
  ${PARALLEL} in parallel) the bench waits, untimed, until the pool is full again; **pool refill per sandbox** is that
  wait divided by the batch (the pool starts one sandbox at a time).
- **docker run --rm**: ${image ? `\`docker run --rm --network none ${image} true\` on ${docker!.origin}; the image is the default snapshot's rootfs, imported once` : "skipped: no docker engine could be reached or started"}.
- **docker provider**: ${image ? "the docker provider (`SANDBAR_PROVIDER=docker`) on that engine and image: create, start, first exec through the exec agent, as floor/node is for the linux provider (no control plane), then destroy (untimed)" : "skipped"}.
- **REST delete**: \`DELETE /api/sandbox/{id}\` of those sandboxes afterwards.

| what | how | runs | p50 ms | p95 ms | mean ms |
|---|---|---|---|---|---|
${table.join("\n")}

Time to interactive against the floor measured in the same run (targets: p50 ≤ 60 ms cold, ≤ 15 ms from a warm pool):

| how | p50 ms | / floor/node (p50) | / floor/node (p95) | / docker (p50) | target |
|---|---|---|---|---|---|
${[ratio("sequential"), ratio(`${PARALLEL} parallel`)].join("\n")}

## Where a cold start goes

The host part of a cold sequential create, by the linux provider's phases (its trace hook): \`cleanup\` =
the record read and what a crash could have left checked; \`dirs\` = the runtime directories, with the
sandbox's cgroups made and the shared tools layer looked up (built once per set of tools) meanwhile;
\`overlay\` = one shell attaching the disk image's loop device, mounting it and the overlay; \`root-prep\` = the sandbox
user and mount points in the new root; \`cgroup\` = what is left to wait of the cgroups (made during
\`dirs\`); \`spawn\` = the launcher started; \`socket\` = launcher spawned until the agent's
socket accepts: sh + setpriv + bwrap + seccomp + the init shell + node start-up + listen, which is what
floor/node measures with a stand-in agent (no cgroup, no seccomp, no init shell).

| phase | p50 ms | p95 ms |
|---|---|---|
${profile.map(([phase, st]) => `| ${phase} | ${ms(st.p50)} | ${ms(st.p95)} |`).join("\n")}
| sum of p50s | ${ms(profile.reduce((a, [, st]) => a + st.p50, 0))} | |

The rest, from the same run's p50s (differences of medians, so approximate):

| part | ms (p50) | what it is |
|---|---|---|
| control plane in a cold create | ${ms(get("  of which create", "sequential")!.p50 - profile.reduce((a, [, st]) => a + st.p50, 0))} | "of which create" minus the provider's phases: authentication, quota admission and the row in one transaction, the answer, HTTP |
| agent start above the floor | ${ms((profile.find(([p]) => p === "socket")?.[1].p50 ?? 0) - get("floor/node", "sequential")!.p50 + get("floor/true", "sequential")!.p50)} | \`socket\` minus (floor/node minus floor/true): the real agent's own start beyond a stand-in that only listens, plus cgroup and init shell |
| first exec, cold minus warm | ${ms(get("  of which 1st exec", "sequential")!.p50 - get("  of which 1st exec", "sequential warm")!.p50)} | what a new agent's first call still pays that a warmed one does not: node:http2, Connect, protobuf descriptors and the process service (loaded right after listening, \`--preload\`, racing the call), the first execution's own bash (subshell hosts start once it has answered; it joins the user cgroup), the control plane's first HTTP/2 connection to the agent (a pool sandbox's warm-up made it) |

## Density

Idle sandboxes (default snapshot, \`memory: 1\` GiB limit each) created one after another through
\`POST /api/sandbox\` until half the machine's memory (${(budget / 2 ** 30).toFixed(1)} GiB) is in use or ${DENSITY_TARGET} run (cap ${DENSITY_CAP}).

| figure | value |
|---|---|
| running at once | **${count}** (${answering} answered an exec afterwards) — target ≥ 300: ${count >= 300 ? "met" : "missed"} |
| stopped because | ${stopReason} |
| memory per sandbox (MemAvailable drop / count) | ${(perSandbox / 2 ** 20).toFixed(1)} MiB (MemAvailable ${(before / 2 ** 30).toFixed(2)} → ${(after / 2 ** 30).toFixed(2)} GiB) |
| time per start (create returns started) | p50 ${ms(start.p50)} ms, p95 ${ms(start.p95)} ms, mean ${ms(start.mean)} ms; ${fillSeconds.toFixed(1)} s for all |
| delete all (4 at once) | ${deleteSeconds.toFixed(1)} s; per delete p50 ${ms(del.p50)} ms, p95 ${ms(del.p95)} ms |
| left afterwards | ${left.processes} processes in the server's sandbox cgroups (\`${cgroupName}\`), ${left.mounts} mounts under \`${runtimeDir}\` |

MemAvailable is host-wide: other work on the shared machine moves it too (either way).
`;
    const out = new URL("./RESULTS.md", import.meta.url);
    await writeFile(out, md);
    log(`wrote ${out.pathname}`);
  } finally {
    await docker?.close().catch(() => undefined);
    await deleteAll(s, created).catch(() => undefined);
    await rm(workDir, { recursive: true, force: true });
    await s.stop();
  }
}

/** --docker-only: the Docker rows alone, sequential and 4 parallel, printed. */
async function dockerOnly(): Promise<void> {
  const docker: BenchEngine = await benchEngine(await snapshotRootfs(), log);
  try {
    for (const [how, width] of [["sequential", 1], [`${PARALLEL} parallel`, PARALLEL]] as const) {
      const runs = Math.ceil(RUNS / width) * width;
      const dr: number[] = [];
      const tti = await pool(runs, width, async (i) => {
        dr.push(await docker.dockerRun());
        return docker.providerTti(i);
      });
      for (const [what, xs] of [["docker run --rm", dr], ["docker provider", tti]] as const) {
        const st = stats(xs);
        console.log(`${what.padEnd(22)} ${how.padEnd(11)} n=${st.n} p50=${ms(st.p50)} ms p95=${ms(st.p95)} ms mean=${ms(st.mean)} ms`);
      }
    }
  } finally {
    await docker.close();
  }
}

/** Cold create→exec on two servers that differ only in their agent bundle, interleaved. */
async function agentAb(other: string): Promise<void> {
  log(`building the agent; two control servers (this agent, and ${other})`);
  const servers = { "this agent": await startBenchServer({ warmPool: 0 }), [`bundle ${other}`]: await startBenchServer({ warmPool: 0, agentBundle: path.resolve(other) }) };
  const names = Object.keys(servers);
  const times = new Map<string, { tti: number[]; create: number[]; exec: number[] }>(names.map((n) => [n, { tti: [], create: [], exec: [] }]));
  try {
    for (const s of Object.values(servers)) {
      const warmUp: string[] = [];
      for (let i = 0; i < 2; i++) await tti(s, warmUp);
      await deleteAll(s, warmUp);
    }
    for (let i = 0; i < RUNS; i++) {
      for (let k = 0; k < names.length; k++) {
        const name = names[(i + k) % names.length]!;
        const s = servers[name]!;
        const created: string[] = [];
        const split = { create: [] as number[], exec: [] as number[] };
        times.get(name)!.tti.push(await tti(s, created, split));
        times.get(name)!.create.push(split.create[0]!);
        times.get(name)!.exec.push(split.exec[0]!);
        await deleteAll(s, created);
      }
    }
    for (const [name, t] of times) {
      for (const [what, xs] of [["REST create→exec", t.tti], ["  of which create", t.create], ["  of which 1st exec", t.exec]] as const) {
        const st = stats(xs);
        console.log(`${name}: ${what.padEnd(20)} n=${st.n} p50=${ms(st.p50)} ms p95=${ms(st.p95)} ms mean=${ms(st.mean)} ms`);
      }
    }
    log(`load average ${loadAvg()}`);
  } finally {
    for (const s of Object.values(servers)) await s.stop();
  }
}

const ab = process.argv.indexOf("--agent-ab");
if (ab >= 0) {
  if (!process.argv[ab + 1]) throw new Error("--agent-ab needs a bundle directory");
  await agentAb(process.argv[ab + 1]!);
} else if (process.argv.includes("--docker-only")) await dockerOnly();
else await main();
