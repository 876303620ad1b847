// Shared by bench/sandboxes and bench/toolbox: a real control server with real sandboxes (the
// agent bundled fresh, as test/sdk does), percentile stats, and a keep-alive REST client.
import { rm } from "node:fs/promises";
import http from "node:http";
import os from "node:os";
import { buildAgentBundle } from "../../packages/control/src/testing/agent-bundle.ts";
import { startTestServer, type TestServer } from "../../packages/control/src/testing/server.ts";
import type { UntypedJson } from "../casts.ts";

export interface Stat {
  n: number;
  p50: number;
  p95: number;
  p99: number;
  mean: number;
}

export function stats(xs: number[]): Stat {
  const s = [...xs].sort((a, b) => a - b);
  const q = (p: number) => s[Math.min(s.length - 1, Math.max(0, Math.ceil(p * s.length) - 1))];
  return { n: s.length, p50: q(0.5), p95: q(0.95), p99: q(0.99), mean: s.reduce((a, b) => a + b, 0) / s.length };
}

export function requireRoot(what: string): void {
  if (process.getuid?.() !== 0) {
    console.error(`${what} must run as root (it starts real sandboxes)`);
    process.exit(1);
  }
}

export function log(line: string): void {
  console.error(`[bench] ${line}`);
}

export function machine(): string {
  return `${os.cpus().length} × ${os.cpus()[0]?.model ?? "cpu"}, ${Math.round(os.totalmem() / 2 ** 30)} GiB, kernel ${os.release()}, node ${process.version}`;
}

export const loadAvg = () => os.loadavg().map((l) => l.toFixed(2)).join(" / ");

export interface BenchServer {
  server: TestServer;
  url: string;
  key: string;
  /** The agent bundle directory (its path shows in every agent's command line). */
  bundle: string;
  rest: Rest;
  stop(): Promise<void>;
}

/** A control server with the agent bundled fresh (or, given `agentBundle`, that bundle directory, left in place). */
export async function startBenchServer(settings: { warmPool?: number; agentBundle?: string } = {}): Promise<BenchServer> {
  const given = settings.agentBundle;
  const bundle = given ?? (await buildAgentBundle("sandbar-bench-agent-"));
  const server = await startTestServer({ settings: { agentBundle: bundle, ...settings } });
  const rest = new Rest(server.url, server.adminKey);
  return {
    server,
    url: server.url,
    key: server.adminKey,
    bundle,
    rest,
    async stop() {
      rest.close();
      await server.stop();
      if (!given) await rm(bundle, { recursive: true, force: true });
    },
  };
}

export interface Reply {
  status: number;
  body: UntypedJson;
}

/** JSON over HTTP/1.1 keep-alive (node:http, no fetch overhead in the figures). */
export class Rest {
  readonly agent = new http.Agent({ keepAlive: true, maxSockets: 16 });
  readonly base: URL;
  readonly key: string;
  constructor(base: string, key: string) {
    this.base = new URL(base);
    this.key = key;
  }

  call(method: string, path: string, body?: unknown): Promise<Reply> {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    return new Promise((resolve, reject) => {
      const req = http.request(
        {
          host: this.base.hostname,
          port: this.base.port,
          method,
          path: `/api${path}`,
          agent: this.agent,
          headers: {
            authorization: `Bearer ${this.key}`,
            ...(payload ? { "content-type": "application/json", "content-length": payload.length } : {}),
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () => {
            const text = Buffer.concat(chunks).toString();
            let parsed: unknown = text;
            try {
              parsed = text ? JSON.parse(text) : undefined;
            } catch {
              /* not JSON: keep the text */
            }
            resolve({ status: res.statusCode ?? 0, body: parsed });
          });
          res.on("error", reject);
        },
      );
      req.on("error", reject);
      req.end(payload);
    });
  }

  async ok(method: string, path: string, body?: unknown): Promise<UntypedJson> {
    const r = await this.call(method, path, body);
    if (r.status >= 300) throw new Error(`${method} ${path} answered ${r.status}: ${JSON.stringify(r.body)}`);
    return r.body;
  }

  close(): void {
    this.agent.destroy();
  }
}

/** Runs `once` `runs` times with `width` at once; returns the figures in completion order. */
export async function pool(runs: number, width: number, once: (i: number) => Promise<number>): Promise<number[]> {
  const out: number[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: width }, async () => {
      while (next < runs) out.push(await once(next++));
    }),
  );
  return out;
}

export const ms = (x: number) => x.toFixed(x < 10 ? 2 : 1);
