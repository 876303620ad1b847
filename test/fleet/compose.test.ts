import { type ChildProcess, execFileSync, spawn, spawnSync } from "node:child_process";
import { request } from "node:http";
import { fileURLToPath } from "node:url";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { ApiKeyService } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import { Permission } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";
import { connect } from "node:net";
import { parse } from "yaml";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../../packages/control/src/testing/server.ts";
import { freePort } from "@sandbar/runner/free-port";
import { eventually } from "../../packages/control/src/sandboxes/testing/fixtures.ts";
import { callFrom } from "../../packages/control/src/limits/test-client.ts";
import type { Settings } from "../../packages/control/src/settings.ts";

// The docker-compose fleet, validated for real where this machine allows: no public registry is
// reachable, so its images cannot be pulled and the fleet itself is not started here. What runs:
// Debian's docker-compose (1.29) checks and resolves docker-compose.yml (its answer is what is
// asserted), and Debian's haproxy runs deploy/haproxy.cfg unchanged in front of two real control
// servers on one PostgreSQL: REST over HTTP/1.1 and gRPC over h2c pass through it, on both
// replicas, each connection stating its client in a PROXY v2 header (rate limits and audit see
// the client, not haproxy), and the survivor serves alone when one replica stops.

const REPO = fileURLToPath(new URL("../../", import.meta.url));
const has = (cmd: string) => spawnSync("sh", ["-c", `command -v ${cmd}`]).status === 0;
const KEY = "sbr_" + "ab".repeat(32);

function composeConfig(env: NodeJS.ProcessEnv): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync("docker-compose", ["-f", "docker-compose.yml", "config"], { cwd: REPO, env: { PATH: process.env.PATH, ...env }, encoding: "utf8" });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** What the test reads of `docker-compose config`'s answer (the resolved file). */
interface ComposeService {
  image?: string;
  entrypoint?: string[];
  environment: Record<string, string>;
  depends_on: Record<string, { condition: string }>;
  ports?: { published: number; target: number }[];
  volumes: string[];
  networks?: Record<string, { ipv4_address?: string }>;
  privileged?: boolean;
}
interface ComposeFile {
  services: Record<string, ComposeService>;
  volumes: Record<string, unknown>;
  networks: Record<string, { ipam: { config: { subnet: string }[] } }>;
}

describe.skipIf(!has("docker-compose"))("docker-compose.yml", () => {
  const resolved = (): ComposeFile => {
    const r = composeConfig({ SANDBAR_BOOTSTRAP_API_KEY: KEY });
    expect(r.status, r.stderr).toBe(0);
    return parse(r.stdout);
  };

  it("is valid and describes the fleet: PostgreSQL, two control replicas behind a load balancer, two self-registering runners", () => {
    const { services, volumes } = resolved();
    expect(Object.keys(services).sort()).toEqual(["control-1", "control-2", "fleet-init", "lb", "postgres", "runner-1", "runner-2"]);
    for (const name of ["control-1", "control-2"]) {
      const c = services[name];
      expect(c.environment).toMatchObject({ DATABASE_URL: "postgresql://sandbar:sandbar@postgres:5432/sandbar", SANDBAR_BOOTSTRAP_API_KEY: KEY });
      expect(c.depends_on.postgres.condition).toBe("service_healthy");
      expect(c.ports).toBeUndefined(); // reached through the load balancer only
      // What one replica writes and another reads is on shared volumes.
      expect(c.volumes.map((v: string) => v.replace(/:rw$/, "")).sort()).toEqual(["archives:/var/lib/sandbar/archives", "backups:/var/lib/sandbar/backups", "volume-data:/var/lib/sandbar/volumes"]);
    }
    expect(services.lb.ports).toEqual([{ published: 3000, target: 3000 }]);
    expect(services.postgres.image).toBe("postgres:17");
    expect(services.lb.entrypoint).toEqual(["haproxy", "-W", "-db", "-f", "/app/deploy/haproxy.cfg"]);
    expect(services.lb.environment).toMatchObject({ CONTROL_1: "control-1:3000", CONTROL_2: "control-2:3000" });
    // The replicas take PROXY headers from the balancer's fixed address only.
    expect(services.lb.networks).toEqual({ default: { ipv4_address: "172.29.213.10" } });
    for (const name of ["control-1", "control-2"]) expect(services[name].environment.SANDBAR_PROXY_PROTOCOL_FROM).toBe("172.29.213.10");
    const subnets = new Set<string>();
    for (const name of ["runner-1", "runner-2"]) {
      const r = services[name];
      expect(r.privileged).toBe(true);
      expect(r.entrypoint).toEqual(["/app/deploy/runner-entrypoint.sh"]);
      expect(r.environment).toMatchObject({ SANDBAR_CONTROL_URL: "http://lb:3000", SANDBAR_RUNNER_NAME: name, SANDBAR_RUNNER_ADVERTISE_URL: `http://${name}:3100`, SANDBAR_RUNNER_PORT: "3100" });
      subnets.add(r.environment.SANDBAR_SANDBOX_SUBNET);
      expect(r.volumes.map((v: string) => v.replace(/:rw$/, ""))).toEqual(["fleet-config:/fleet:ro", `${name}:/var/lib/sandbar`]);
    }
    expect(subnets.size).toBe(2); // each runner its own egress subnet
    const { networks } = resolved();
    expect(networks.default.ipam.config).toEqual([{ subnet: "172.29.213.0/24" }]);
    expect(Object.keys(volumes).sort()).toEqual(["archives", "backups", "fleet-config", "pgdata", "runner-1", "runner-2", "volume-data"]);
  });

  it("refuses to resolve without a bootstrap key, saying which variable is missing", () => {
    const r = composeConfig({});
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain("set SANDBAR_BOOTSTRAP_API_KEY");
  });

  it("the scripts it runs exist: the runner entrypoint (executable, valid sh) and fleet-init (valid JavaScript)", () => {
    execFileSync("sh", ["-n", "deploy/runner-entrypoint.sh"], { cwd: REPO });
    expect(execFileSync("sh", ["-c", "test -x deploy/runner-entrypoint.sh && echo ok"], { cwd: REPO, encoding: "utf8" }).trim()).toBe("ok");
    execFileSync(process.execPath, ["--check", "deploy/fleet-init.mjs"], { cwd: REPO });
  });
});

describe.skipIf(!has("haproxy"))("deploy/haproxy.cfg in front of two control replicas", () => {
  let a: TestServer;
  let b: TestServer;
  let lb: ChildProcess;
  let lbUrl: string;
  let lbOut = "";

  // haproxy reaches the replicas from 127.0.0.1: that address, and no other, may send PROXY
  // headers. Failed authentications are counted per client in the shared database.
  const FAILED_AUTH = 4;
  const replica: Partial<Settings> = {
    proxyProtocolFrom: ["127.0.0.1/32"],
    rateLimits: { store: "postgres", windowSeconds: 60, limits: { anonymous: 600, authenticated: 50_000, "sandbox-create": 600, "sandbox-lifecycle": 50_000, "failed-auth": FAILED_AUTH } },
  };

  beforeAll(async () => {
    a = await startTestServer({ settings: replica });
    b = await startTestServer({ databaseUrl: a.server.databaseUrl, adminKey: a.adminKey, settings: replica });
    const port = await freePort();
    lbUrl = `http://127.0.0.1:${port}`;
    const env = { ...process.env, LISTEN: `127.0.0.1:${port}`, CONTROL_1: `127.0.0.1:${a.server.port}`, CONTROL_2: `127.0.0.1:${b.server.port}` };
    execFileSync("haproxy", ["-c", "-q", "-f", "deploy/haproxy.cfg"], { cwd: REPO, env });
    lb = spawn("haproxy", ["-db", "-f", "deploy/haproxy.cfg"], { cwd: REPO, env, stdio: ["ignore", "pipe", "pipe"] });
    lb.stdout!.on("data", (c: Buffer) => (lbOut += c.toString()));
    lb.stderr!.on("data", (c: Buffer) => (lbOut += c.toString()));
    await eventually("haproxy to listen", async () => (await restOnce()).status === 200, 10_000);
  }, 180_000);

  afterAll(async () => {
    lb?.kill("SIGKILL");
    await b?.stop();
    await a?.stop();
  });

  /** One REST call on a connection of its own (HTTP/1.1), so each is balanced anew. */
  function restOnce(): Promise<{ status: number }> {
    return new Promise<{ status: number }>((resolve, reject) => {
      const req = request(`${lbUrl}/api/api-keys/current`, { agent: false, headers: { authorization: `Bearer ${a.adminKey}` } }, (res) => {
        res.resume();
        res.on("end", () => resolve({ status: res.statusCode ?? 0 }));
      });
      req.on("error", reject);
      req.end();
    }).catch(() => ({ status: 0 }));
  }
  /** Connections haproxy logged (one tcplog line each, on close) per replica. */
  const served = (replica: string) => lbOut.split("\n").filter((l) => l.includes(` api control/${replica} `)).length;

  it("passes REST (HTTP/1.1) and gRPC (h2c) through to the replicas, each new connection to the next replica", async () => {
    const [one, two] = [served("control-1"), served("control-2")];
    for (let i = 0; i < 4; i++) expect((await restOnce()).status).toBe(200);
    await eventually("haproxy to log the connections", async () => served("control-1") + served("control-2") >= one + two + 4, 5000);
    expect(served("control-1") - one).toBe(2);
    expect(served("control-2") - two).toBe(2);
    // gRPC over cleartext HTTP/2 with prior knowledge, through the balancer.
    for (let i = 0; i < 2; i++) {
      const client = createClient(ApiKeyService, createGrpcTransport({ baseUrl: lbUrl }));
      const current = await client.getCurrentApiKey({}, { headers: { authorization: `Bearer ${a.adminKey}` } });
      expect(current.name).toBeTruthy();
    }
  });

  it("each client's own address reaches the replicas (PROXY v2): one client's failed authentications do not limit another; audit records the client", async () => {
    // Clients on loopback addresses of their own (127.0.0.0/8 is all local), all through haproxy.
    const [noisy, quiet, grpcClient] = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    const bad = "sbr_" + "0".repeat(64);
    const statuses: number[] = [];
    for (let i = 0; i < FAILED_AUTH; i++) statuses.push((await callFrom(noisy, lbUrl, "GET", "/sandbox", { token: bad })).status);
    // Counted on both replicas together, under the client's address: the limit-th failure is refused.
    expect(statuses).toEqual([...Array(FAILED_AUTH - 1).fill(401), 429]);
    // The replica that did not answer the 429 learns of the block from the store (within a second):
    // both replicas (haproxy takes turns) refuse the noisy client.
    await eventually("both replicas to refuse the noisy client", async () => (await callFrom(noisy, lbUrl, "GET", "/sandbox", { token: a.adminKey })).status === 429 && (await callFrom(noisy, lbUrl, "GET", "/sandbox", { token: a.adminKey })).status === 429);
    for (let i = 0; i < 2; i++) {
      expect((await callFrom(noisy, lbUrl, "GET", "/sandbox", { token: a.adminKey })).status).toBe(429);
      expect((await callFrom(quiet, lbUrl, "GET", "/sandbox", { token: a.adminKey })).status).toBe(200);
    }
    const made = await callFrom(quiet, lbUrl, "POST", "/api-keys", { token: a.adminKey, body: { name: "through-haproxy", permissions: ["write:sandboxes"] } });
    expect(made.status).toBe(201);
    // gRPC over h2c from another client, through haproxy.
    const transport = createGrpcTransport({ baseUrl: lbUrl, nodeOptions: { createConnection: () => connect({ host: "127.0.0.1", port: Number(new URL(lbUrl).port), localAddress: grpcClient }) } });
    await createClient(ApiKeyService, transport).createApiKey({ name: "grpc-through-haproxy", permissions: [Permission.WRITE_SANDBOXES] }, { headers: { authorization: `Bearer ${a.adminKey}` } });
    const audited = async (name: string) => {
      const list = await callFrom(quiet, lbUrl, "GET", `/admin/audit?targetId=${name}`, { token: a.adminKey });
      expect(list.status).toBe(200);
      return list.body.items.map((e: { ipAddress: string }) => e.ipAddress);
    };
    expect(await audited("through-haproxy")).toEqual([quiet]);
    expect(await audited("grpc-through-haproxy")).toEqual([grpcClient]);
  });

  it("a replica that stops is taken out: the survivor serves every call", async () => {
    await b.stop();
    // Health checks every 2 s, two misses: once haproxy marks it down, no connection goes to it.
    await eventually("haproxy to mark the stopped replica down", () => /control-2 is DOWN/.test(lbOut), 30_000);
    const answers = await Promise.all(Array.from({ length: 8 }, () => restOnce()));
    expect(answers.map((x) => x.status)).toEqual(Array(8).fill(200));
    const client = createClient(ApiKeyService, createGrpcTransport({ baseUrl: lbUrl }));
    expect((await client.getCurrentApiKey({}, { headers: { authorization: `Bearer ${a.adminKey}` } })).name).toBeTruthy();
    expect(lbOut).toMatch(/control-2 is DOWN/);
  }, 30_000);
});
