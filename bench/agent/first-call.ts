// An agent's start and first call without a sandbox around it, interleaved between agent bundles:
// spawn → its socket accepts, then at once one Execute("true") over a new HTTP/2 connection (what
// a cold sandbox's first exec asks of its agent), then a second one. Printed; writes nothing.
//   node bench/agent/first-call.ts [--runs N] <name>=<bundle dir> ...
import { spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { sh } from "../../packages/control/src/sandboxes/testing/agent-client.ts";
import { snapshotNodeArgs } from "../../packages/agent/snapshot-blob.ts";
import { ms, stats } from "../sandboxes/support.ts";

const { values, positionals } = parseArgs({ options: { runs: { type: "string", default: "20" } }, allowPositionals: true });
const bundles = positionals.map((p) => p.split("=", 2) as [string, string]);
if (bundles.length === 0) throw new Error("give <name>=<bundle dir> at least once");
const dir = await mkdtemp(path.join(os.tmpdir(), "sandbar-first-call-"));
const secret = "bench-secret";
await writeFile(path.join(dir, "secret"), secret);

const accepts = (socket: string) =>
  new Promise<boolean>((resolve) => {
    const s = net.connect(socket);
    s.once("connect", () => (s.destroy(), resolve(true)));
    s.once("error", () => resolve(false));
  });

type Row = { listen: number; first: number; second: number };
const rows = new Map<string, Row[]>(bundles.map(([n]) => [n, []]));
try {
  await sh({ socket: "/nonexistent", secret }, "true").catch(() => undefined); // the client's own modules
  for (let i = 0; i < Number(values.runs) + 1; i++) {
    for (const [name, bundle] of i % 2 ? [...bundles].reverse() : bundles) {
      const socket = path.join(dir, "agent.sock");
      await rm(socket, { force: true });
      await rm(path.join(dir, "tunnel.sock"), { force: true });
      const t0 = performance.now();
      const child = spawn(process.execPath, [...(process.env.AGENT_NODE_EXTRA?.split(" ").filter(Boolean) ?? []), "--use-openssl-ca", ...snapshotNodeArgs(bundle, bundle), path.join(bundle, "agent.mjs"), "--socket", socket, "--secret-file", path.join(dir, "secret"), "--state-dir", path.join(dir, "state"), "--preload"], { stdio: "ignore" });
      try {
        while (!(await accepts(socket))) await new Promise((r) => setTimeout(r, 0.5));
        const t1 = performance.now();
        const r = await sh({ socket, secret }, "true");
        const t2 = performance.now();
        await sh({ socket, secret }, "true");
        const t3 = performance.now();
        if (r.exitCode !== 0) throw new Error(`exec exited ${r.exitCode}`);
        if (i > 0) rows.get(name)!.push({ listen: t1 - t0, first: t2 - t1, second: t3 - t2 }); // run 0 warms the page cache
      } finally {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM"); // a graceful stop (a --cpu-prof given in AGENT_NODE_EXTRA is written)
        const kill = setTimeout(() => child.kill("SIGKILL"), 5000);
        await exited;
        clearTimeout(kill);
      }
    }
  }
  for (const [name, rs] of rows) {
    const line = (["listen", "first", "second"] as const).map((k) => `${k} p50 ${ms(stats(rs.map((r) => r[k])).p50)}`).join("  ");
    console.log(`${name.padEnd(10)} n=${rs.length}  ${line} ms`);
  }
  console.log(`load average ${os.loadavg().map((l) => l.toFixed(2)).join(" / ")}`);
} finally {
  await rm(dir, { recursive: true, force: true });
}
