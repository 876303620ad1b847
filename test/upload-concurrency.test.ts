import { createHash, randomBytes } from "node:crypto";
import http from "node:http";
import { rm } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { api, buildAgentBundle, startTestServer, type TestServer } from "@sandbar/control/testing";
import { Sandbar } from "../packages/sdk/src/index.ts";

// Many uploads at once into one real sandbox (real control server, real agent): control's own
// traffic must not trip the agent's HTTP/2 flood protection, and every answer says what became
// of its file. Each file is read back by SHA-256.

const UPLOADS = 100;
const MIB = 2 ** 20;

let t: TestServer;
let bundle: string;
let id: string;
let home: string;

beforeAll(async () => {
  if (process.getuid?.() !== 0) throw new Error("this suite runs real sandboxes: run it as root");
  bundle = await buildAgentBundle("sandbar-upload-conc-agent-");
  t = await startTestServer({ settings: { agentBundle: bundle } });
  const created = await api(t.url, t.adminKey, "POST", "/sandbox", {});
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  id = created.body.id;
  home = (await exec('printf %s "$HOME"')).result;
}, 180_000);
afterAll(async () => {
  if (id) await api(t.url, t.adminKey, "DELETE", `/sandbox/${id}`).catch(() => undefined);
  await t?.stop();
  if (bundle) await rm(bundle, { recursive: true, force: true });
});

async function exec(command: string): Promise<{ exitCode: number; result: string }> {
  const res = await api(t.url, t.adminKey, "POST", `/toolbox/${id}/toolbox/process/execute`, { command });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

const sha256 = (b: Buffer) => createHash("sha256").update(b).digest("hex");

/** `sha256sum` of every file in dir, by name. */
async function sums(dir: string): Promise<Map<string, string>> {
  const out = await exec(`cd ${dir} && sha256sum *`);
  expect(out.exitCode, out.result).toBe(0);
  return new Map(out.result.trim().split("\n").map((l) => { const [sum, name] = l.split(/\s+/); return [name, sum]; }));
}

/** One REST multipart upload (`files/upload?path=`): its status and body. */
function restUpload(dest: string, content: Buffer, agent: http.Agent): Promise<{ status: number; body: string }> {
  const boundary = "----conc" + randomBytes(8).toString("hex");
  const body = Buffer.concat([
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="f.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`),
    content,
    Buffer.from(`\r\n--${boundary}--\r\n`),
  ]);
  const url = new URL(t.url);
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: url.hostname,
      port: url.port,
      method: "POST",
      agent,
      path: `/api/toolbox/${id}/toolbox/files/upload?path=${encodeURIComponent(dest)}`,
      headers: { authorization: `Bearer ${t.adminKey}`, "content-type": `multipart/form-data; boundary=${boundary}`, "content-length": body.length },
    }, (res) => {
      let text = "";
      res.on("data", (c: Buffer) => (text += c.toString()));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

describe(`${UPLOADS} concurrent 1 MiB uploads into one sandbox`, () => {
  it("through REST: every one answers 200 and reads back by SHA-256", async () => {
    const dir = `${home}/rest`;
    await exec(`mkdir -p ${dir}`);
    const files = Array.from({ length: UPLOADS }, () => randomBytes(MIB));
    const agent = new http.Agent({ keepAlive: true, maxSockets: UPLOADS });
    const answers = await Promise.all(files.map((f, i) => restUpload(`${dir}/f${i}`, f, agent)));
    agent.destroy();
    const failed = answers.map((a, i) => `f${i}: ${a.status} ${a.body}`).filter((_, i) => answers[i].status !== 200);
    console.log(`REST: ${UPLOADS - failed.length} of ${UPLOADS} answered 200; others: ${failed.slice(0, 3).join("; ")}`);
    expect(failed).toEqual([]);
    const got = await sums(dir);
    expect(files.map((_, i) => got.get(`f${i}`))).toEqual(files.map(sha256));
  }, 300_000);

  it("through gRPC (@sandbar/sdk's fs.upload, FileService.UploadFile forwarded by control): every one answers and reads back by SHA-256", async () => {
    const dir = `${home}/grpc`;
    await exec(`mkdir -p ${dir}`);
    const files = Array.from({ length: UPLOADS }, () => randomBytes(MIB));
    const sandbar = new Sandbar({ apiKey: t.adminKey, apiUrl: `${t.url}/api`, env: {}, envFileDir: false, configDir: "/nonexistent" });
    try {
      const sandbox = await sandbar.sandboxes.get(id);
      const answers = await Promise.all(files.map((f, i) => sandbox.fs.upload(`${dir}/f${i}`, f).then((out) => `ok ${Number(out.bytes)}`, (err: Error) => `error ${err.message}`)));
      const failed = answers.map((a, i) => `f${i}: ${a}`).filter((_, i) => answers[i] !== `ok ${MIB}`);
      console.log(`gRPC: ${UPLOADS - failed.length} of ${UPLOADS} answered; others: ${failed.slice(0, 3).join("; ")}`);
      expect(failed).toEqual([]);
    } finally {
      sandbar.close();
    }
    const got = await sums(dir);
    expect(files.map((_, i) => got.get(`f${i}`))).toEqual(files.map(sha256));
  }, 300_000);
});
