// The load generator of bench/preview, run in a worker thread so that it does not share an event
// loop with the control server it measures. Sequential mode: one request at a time, each timed.
// Concurrent mode: `concurrency` keep-alive connections for `durationMs`, requests counted.
import http from "node:http";
import { connect } from "node:net";
import { parentPort, workerData } from "node:worker_threads";
import { dialTunnel } from "../../packages/control/src/preview/tunnel-dial.ts";

export interface LoadJob {
  /** Plain TCP (host, port) or the agent's tunnel (socket, secret, port). */
  target: { host: string; port: number } | { tunnelSocket: string; secret: string; port: number };
  path: string;
  headers: Record<string, string>;
  mode: "sequential" | "concurrent";
  requests?: number;
  concurrency?: number;
  durationMs?: number;
}

export interface LoadResult {
  latenciesMs: number[];
  completed: number;
  seconds: number;
  errors: number;
}

class TunnelAgent extends http.Agent {
  readonly #t: { tunnelSocket: string; secret: string; port: number };
  constructor(t: { tunnelSocket: string; secret: string; port: number }, opts: http.AgentOptions) {
    super(opts);
    this.#t = t;
  }
  override createConnection(_o: unknown, cb: (err: Error | null, s?: import("node:stream").Duplex) => void) {
    dialTunnel({ secret: this.#t.secret, tunnel: () => connect({ path: this.#t.tunnelSocket, allowHalfOpen: true }) }, this.#t.port).then(
      (s) => {
        cb(null, s);
        s.resume();
      },
      (e: Error) => cb(e),
    );
    return undefined;
  }
}

async function run(job: LoadJob): Promise<LoadResult> {
  const opts = { keepAlive: true, maxSockets: job.concurrency ?? 1 };
  const agent = "tunnelSocket" in job.target ? new TunnelAgent(job.target, opts) : new http.Agent(opts);
  const host = "host" in job.target ? job.target.host : "127.0.0.1";
  const once = () =>
    new Promise<void>((resolve, reject) => {
      const req = http.request({ host, port: job.target.port, path: job.path, headers: job.headers, agent }, (res) => {
        res.resume();
        res.on("end", () => (res.statusCode === 200 ? resolve() : reject(new Error(`status ${res.statusCode}`))));
      });
      req.on("error", reject);
      req.end();
    });
  const latenciesMs: number[] = [];
  let errors = 0;
  const started = performance.now();
  if (job.mode === "sequential") {
    for (let i = 0; i < (job.requests ?? 1000); i++) {
      const t0 = performance.now();
      await once().catch(() => errors++);
      latenciesMs.push(performance.now() - t0);
    }
  } else {
    const until = started + (job.durationMs ?? 5000);
    await Promise.all(
      Array.from({ length: job.concurrency ?? 16 }, async () => {
        while (performance.now() < until) {
          const t0 = performance.now();
          await once().catch(() => errors++);
          latenciesMs.push(performance.now() - t0);
        }
      }),
    );
  }
  const seconds = (performance.now() - started) / 1000;
  agent.destroy();
  return { latenciesMs, completed: latenciesMs.length - errors, seconds, errors };
}

if (parentPort) parentPort.postMessage(await run(workerData as LoadJob));
