import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import http from "node:http";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startFixture, type Fixture } from "./test-fixture.ts";
import { eventually } from "../../../../protocol/src/testing/eventually.ts";

// Uploads whose agent goes away before it answers (a real agent process, killed): the answer
// says what is known of the file instead of the bare stream error, as 503 (upload it again).
// The destinations are FIFOs nobody reads, so the agent stays in its open(2) of each.

let f: Fixture;
beforeAll(async () => {
  f = await startFixture({ agentProcess: true });
});
afterAll(async () => {
  await f?.stop();
});

const MIB = 2 ** 20;

/** One REST multipart upload (`files/upload?path=`) of `size` bytes: its status and message. */
function upload(dest: string, size: number): Promise<{ status: number; message: string }> {
  const boundary = "----lost" + randomBytes(8).toString("hex");
  const head = Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="f.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`);
  const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
  const url = new URL(`${f.toolbox}/files/upload?path=${encodeURIComponent(dest)}`);
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: url.hostname,
      port: url.port,
      method: "POST",
      path: url.pathname + url.search,
      headers: { authorization: `Bearer ${f.adminKey}`, "content-type": `multipart/form-data; boundary=${boundary}`, "content-length": head.length + size + tail.length },
    }, (res) => {
      let text = "";
      res.on("data", (c: Buffer) => (text += c.toString()));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, message: (JSON.parse(text) as { message?: string }).message ?? text }));
    });
    // The client may still be sending when the answer comes.
    req.on("error", (err) => (err.message.includes("EPIPE") || err.message.includes("ECONNRESET") ? undefined : reject(err)));
    req.write(head);
    req.end(Buffer.concat([randomBytes(size), tail]));
  });
}

/** Bytes the agent has read (its socket among them), and its threads blocked opening a FIFO. */
const readBytes = () => Number(/^rchar: (\d+)$/m.exec(readFileSync(`/proc/${f.agentPid}/io`, "utf8"))![1]);
const openingFifos = () =>
  readdirSync(`/proc/${f.agentPid}/task`).filter((t) => {
    try {
      return readFileSync(`/proc/${f.agentPid}/task/${t}/wchan`, "utf8") === "wait_for_partner";
    } catch {
      return false;
    }
  }).length;

it("an upload sent whole says its file's state is unknown; one broken off says its file is incomplete (503 each)", async () => {
  const whole = join(f.root, "whole.fifo");
  const broken = join(f.root, "broken.fifo");
  await promisify(execFile)("mkfifo", [whole, broken]);
  const before = readBytes();
  // 100 KiB fits the agent's stream window: all of it reaches the agent while it waits in open(2).
  // 16 MiB does not: the agent reads no more than its 1 MiB window of it meanwhile.
  const small = upload(whole, 100 * 1024);
  const large = upload(broken, 16 * MIB);
  await eventually("both uploads at the agent, waiting in open(2)", () => openingFifos() >= 2 && readBytes() - before >= 100 * 1024 + MIB);
  process.kill(f.agentPid, "SIGKILL");

  const [a, b] = await Promise.all([small, large]);
  expect(a.status).toBe(503);
  expect(a.message).toMatch(new RegExp(`^the upload of ${whole} was sent whole, but the sandbox's answer was lost \\(.+\\): whether the file was written completely is unknown`));
  expect(b.status).toBe(503);
  expect(b.message).toMatch(new RegExp(`^the upload of ${broken} broke off before all of it was sent \\(.+\\): it did not take effect`));
});
