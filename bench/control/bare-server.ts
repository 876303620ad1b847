/**
 * The floor: a bare node:http server answering one path with a fixed JSON body, the same
 * bytes and headers the control server sends for it. Run as a forked child of run.ts:
 * BARE_PATH and BARE_BODY come from the environment; it reports its port over IPC.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";

const path = process.env.BARE_PATH;
const body = process.env.BARE_BODY;
if (!path || body === undefined || !process.send) {
  console.error("bare-server: run it from bench/control/run.ts (needs BARE_PATH, BARE_BODY and an IPC channel)");
  process.exit(2);
}

const payload = Buffer.from(body, "utf8");
const headers = { "content-type": "application/json; charset=utf-8", "content-length": payload.length };

// Same keep-alive settings as the control server's HTTP/1.1 listener.
const server = http.createServer({ keepAliveTimeout: 65_000, requestTimeout: 0 }, (req, res) => {
  if (req.method === "GET" && req.url === path) res.writeHead(200, headers).end(payload);
  else res.writeHead(404).end();
});

server.listen(0, "127.0.0.1", () => {
  process.send!({ port: (server.address() as AddressInfo).port });
});
process.on("disconnect", () => process.exit(0));
process.on("SIGTERM", () => process.exit(0));
