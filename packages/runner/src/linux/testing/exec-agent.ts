// A stand-in for the real agent in the runner's tests and bench: it listens on the unix socket
// the provider names and runs one command per connection. Request: one JSON line
// {argv: string[], stdin?: string}. Reply: one JSON line {code, signal, stdout, stderr}.
// Only node built-ins, erasable types: it runs inside sandboxes on the bind-mounted node.
import { spawn } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import net from "node:net";

interface Request {
  argv?: string[];
  stdin?: string;
  secret?: boolean;
}

const argv = process.argv.slice(2);
// Set by the sandbox's supervising init; an agent keeps it from its children (as the real one does).
delete process.env.SANDBAR_AGENT_RESTARTS;
const flag = (name: string) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : undefined;
};
const socketPath = flag("--socket");
if (!socketPath) {
  console.error("exec-agent: --socket <path> is required");
  process.exit(2);
}
const secretFile = flag("--secret-file");
const CAP = 1 << 20;

function handle(req: Request, reply: (v: unknown) => void): void {
  if (req.secret) {
    reply({ secret: secretFile ? readFileSync(secretFile, "utf8") : null });
    return;
  }
  if (!Array.isArray(req.argv) || req.argv.length === 0) {
    reply({ error: "argv is required" });
    return;
  }
  let stdout = "";
  let stderr = "";
  let child;
  try {
    child = spawn(req.argv[0], req.argv.slice(1), { stdio: ["pipe", "pipe", "pipe"] });
  } catch (err) {
    reply({ error: String(err) });
    return;
  }
  child.stdout.on("data", (c: Buffer) => {
    if (stdout.length < CAP) stdout += c.toString();
  });
  child.stderr.on("data", (c: Buffer) => {
    if (stderr.length < CAP) stderr += c.toString();
  });
  child.stdin.on("error", () => undefined);
  child.stdin.end(req.stdin ?? "");
  child.on("error", (err) => reply({ error: String(err) }));
  child.on("close", (code, signal) => reply({ code, signal, stdout, stderr }));
}

const server = net.createServer((conn) => {
  let buf = "";
  let done = false;
  conn.on("error", () => undefined);
  conn.on("data", (c: Buffer) => {
    buf += c.toString();
    const nl = buf.indexOf("\n");
    if (nl < 0 || done) return;
    done = true;
    let req: Request;
    try {
      req = JSON.parse(buf.slice(0, nl)) as Request;
    } catch {
      conn.end(JSON.stringify({ error: "bad request" }) + "\n");
      return;
    }
    handle(req, (v) => conn.end(JSON.stringify(v) + "\n"));
  });
});
// --exit-when-listening: the bench's floor, which times node up to a listening socket.
const exitWhenListening = argv.includes("--exit-when-listening");
// A restarted agent (the sandbox's init supervises it) finds its predecessor's socket file.
rmSync(socketPath, { force: true });
server.listen(socketPath, () => {
  if (exitWhenListening) process.exit(0);
});
process.on("SIGTERM", () => process.exit(0));
