import { createHash } from "node:crypto";
import { chmod, mkdir, rename, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";

// A stand-in for the agent in the sandbox tests, until packages/agent ships its bundle. Like the
// agent it takes --socket and --secret-file, serves HTTP/2 on the socket, refuses callers
// without `authorization: Bearer <secret>`, and answers ProcessService/Execute in the Connect
// protocol (JSON), so the tests' client is the real Connect client and works with the real
// agent too. Switches for failure tests, from the sandbox's env: STAND_IN_EXIT_CODE=<n> exits
// at once; STAND_IN_IGNORE_SIGTERM=1 makes a graceful stop wait out its grace period (each
// SIGTERM it ignores is noted in ~/stand-in-signals, which outlives the stop).

const SOURCE = `
import { spawn } from "node:child_process";
import { appendFileSync, readFileSync } from "node:fs";
import http2 from "node:http2";

const argv = process.argv.slice(2);
const flag = (name) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : undefined; };
if (process.env.STAND_IN_EXIT_CODE) {
  console.error("stand-in agent: exiting with " + process.env.STAND_IN_EXIT_CODE + " as asked");
  process.exit(Number(process.env.STAND_IN_EXIT_CODE));
}
const socket = flag("--socket");
const secretFile = flag("--secret-file");
const secret = secretFile ? readFileSync(secretFile, "utf8").trim() : "";
if (!socket || !secret) {
  console.error("stand-in agent: --socket and --secret-file are required");
  process.exit(2);
}
const EXECUTE = "/sandbar.agent.v1.ProcessService/Execute";

function reply(stream, status, body) {
  if (stream.headersSent || stream.destroyed) return;
  stream.respond({ ":status": status, "content-type": "application/json" });
  stream.end(JSON.stringify(body));
}

const server = http2.createServer();
server.on("stream", (stream, headers) => {
  const chunks = [];
  stream.on("error", () => {});
  stream.on("data", (c) => chunks.push(c));
  stream.on("end", () => {
    if (headers.authorization !== "Bearer " + secret) return reply(stream, 401, { code: "unauthenticated", message: "Invalid credentials" });
    if (headers[":path"] !== EXECUTE) return reply(stream, 404, { code: "unimplemented", message: "the stand-in agent serves only " + EXECUTE });
    let req;
    try {
      req = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
    } catch {
      return reply(stream, 400, { code: "invalid_argument", message: "the body is not JSON" });
    }
    const child = spawn("/bin/sh", ["-c", String(req.command ?? "")], { cwd: req.cwd || undefined, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (c) => (out += c));
    child.stderr.on("data", (c) => (out += c));
    child.on("error", (err) => reply(stream, 200, { exitCode: 127, result: String(err) }));
    child.on("close", (code) => reply(stream, 200, { exitCode: code ?? -1, result: out }));
  });
});
server.listen(socket);
process.on("SIGTERM", () => {
  if (!process.env.STAND_IN_IGNORE_SIGTERM) process.exit(0);
  appendFileSync((process.env.HOME || "/tmp") + "/stand-in-signals", "TERM\\n");
});
`;

/** The stand-in as a script in a world-searchable directory (sandbox users must reach it). */
export async function standInAgentBundle(): Promise<string> {
  const dir = path.join(os.tmpdir(), "sandbar-test-agent");
  const file = path.join(dir, `stand-in-${createHash("sha256").update(SOURCE).digest("hex").slice(0, 12)}.mjs`);
  await mkdir(dir, { recursive: true, mode: 0o755 });
  await chmod(dir, 0o755);
  const tmp = `${file}.${process.pid}.tmp`;
  await writeFile(tmp, SOURCE, { mode: 0o644 });
  await rename(tmp, file);
  return file;
}
