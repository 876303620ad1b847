import { rm, writeFile } from "node:fs/promises";
import * as path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { api, buildAgentBundle, sandboxCgroup, startTestServer, type TestServer } from "@sandbar/control/testing";

// Executions side by side in several real sandboxes at once (real control server, real agents),
// each agent off the CPU for long stretches while its shells run, as on a host with far more
// runnable processes than cores (where this was found: 18 of 2,000 lost at 20 sandboxes x 20).
// Every answer must carry its own output, and every execution run exactly once. Before the fixes
// (execute.ts's drain grace judged before the pipes were read; subshell-host.ts's slot pipes
// flowed by node when a host exited) 2-4 of 960 answered 200 {"exitCode":0,"result":""} per run.

const SANDBOXES = 6;
const CONCURRENT = 20;
const ROUNDS = 8;
const COMMAND = "echo s-k-$((6*7))";
/** The CPU each sandbox's agent gets during the rounds: QUOTA_US per PERIOD_US (a throttled agent waits for the next period). */
const QUOTA_US = 10_000;
const PERIOD_US = 400_000;

/** Sets the CPU quota of a sandbox's agent (its own leaf: not its shells); -1: none. cgroup v1 or v2. */
async function agentCpuQuota(id: string, us: number): Promise<void> {
  const v1 = await sandboxCgroup("/sys/fs/cgroup/cpu", id);
  if (v1) {
    await writeFile(path.join(v1, "agent", "cpu.cfs_period_us"), String(PERIOD_US));
    return writeFile(path.join(v1, "agent", "cpu.cfs_quota_us"), String(us));
  }
  const v2 = await sandboxCgroup("/sys/fs/cgroup", id);
  if (!v2) throw new Error(`no cpu cgroup for sandbox ${id}`);
  await writeFile(path.join(v2, "agent", "cpu.max"), `${us < 0 ? "max" : us} ${PERIOD_US}`);
}

let t: TestServer;
let bundle: string;
const ids: string[] = [];

beforeAll(async () => {
  if (process.getuid?.() !== 0) throw new Error("this suite runs real sandboxes: run it as root");
  bundle = await buildAgentBundle("sandbar-exec-conc-agent-");
  t = await startTestServer({ settings: { agentBundle: bundle } });
}, 180_000);
afterAll(async () => {
  for (const id of ids) await api(t.url, t.adminKey, "DELETE", `/sandbox/${id}`).catch(() => undefined);
  await t?.stop();
  if (bundle) await rm(bundle, { recursive: true, force: true });
});

it(`${SANDBOXES} sandboxes x ${CONCURRENT} concurrent executions, ${ROUNDS} rounds: every answer is exit 0 with its output`, async () => {
  for (let i = 0; i < SANDBOXES; i++) {
    const created = await api(t.url, t.adminKey, "POST", "/sandbox", {});
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    ids.push(created.body.id);
  }
  // Each execution also appends a line to a file of its own: one line each, once run, never twice.
  const execute = (id: string, n: string) => api(t.url, t.adminKey, "POST", `/toolbox/${id}/toolbox/process/execute`, { command: `${COMMAND}; echo >> ~/ran-${n}` });
  const wrong: string[] = [];
  let answers = 0;
  // Agents off the CPU for up to ~390 ms at a time while their shells run, without burning the
  // shared cores: each agent's own cgroup leaf (not its shells') gets 10 ms of CPU per 400 ms.
  for (const id of ids) await agentCpuQuota(id, QUOTA_US);
  try {
    for (let r = 0; r < ROUNDS; r++) {
      const round = await Promise.all(ids.flatMap((id) => Array.from({ length: CONCURRENT }, (_, i) => execute(id, `${r}-${i}`).then((res) => ({ id, res })))));
      for (const { id, res } of round) {
        answers++;
        if (res.status !== 200 || res.body?.exitCode !== 0 || res.body?.result !== "s-k-42\n") wrong.push(`round ${r}, ${id}: ${res.status} ${JSON.stringify(res.body)}`);
      }
    }
  } finally {
    for (const id of ids) await agentCpuQuota(id, -1);
  }
  // Files, then lines: as many lines as files, each file made by one line, is one run each.
  for (const id of ids) {
    const counts = await api(t.url, t.adminKey, "POST", `/toolbox/${id}/toolbox/process/execute`, { command: "cd ~ && echo $(ls ran-* | wc -l) $(cat ran-* | wc -l)" });
    if (counts.body?.result !== `${ROUNDS * CONCURRENT} ${ROUNDS * CONCURRENT}\n`) wrong.push(`${id}: files, lines ${JSON.stringify(counts.body)}`);
  }
  console.log(`${answers} executions (${SANDBOXES} sandboxes x ${CONCURRENT} concurrent x ${ROUNDS} rounds): ${wrong.length} wrong`);
  expect(wrong).toEqual([]);
  expect(answers).toBe(SANDBOXES * CONCURRENT * ROUNDS);
}, 600_000);
