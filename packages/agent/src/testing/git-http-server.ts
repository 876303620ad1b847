/**
 * Test support: git's own smart-HTTP server (`git http-backend`, a CGI
 * program) behind a small Node HTTP server that demands basic auth.
 */
import { spawn } from "node:child_process";
import * as http from "node:http";
import type { AddressInfo } from "node:net";

export interface GitHttpServer {
  url: string;
  /** Authorization headers the server saw (proof that credentials were sent). */
  seenAuth: string[];
  close(): Promise<void>;
}

export async function startGitHttpServer(projectRoot: string, username: string, password: string): Promise<GitHttpServer> {
  const expected = "Basic " + Buffer.from(`${username}:${password}`).toString("base64");
  const seenAuth: string[] = [];
  const server = http.createServer((req, res) => {
    const auth = req.headers.authorization;
    if (auth) seenAuth.push(auth);
    if (auth !== expected) {
      res.writeHead(401, { "WWW-Authenticate": 'Basic realm="git"' });
      res.end("authentication required");
      req.resume();
      return;
    }
    const url = new URL(req.url ?? "/", "http://localhost");
    const env: NodeJS.ProcessEnv = {
      PATH: process.env.PATH,
      GIT_PROJECT_ROOT: projectRoot,
      GIT_HTTP_EXPORT_ALL: "1",
      PATH_INFO: decodeURIComponent(url.pathname),
      QUERY_STRING: url.search.slice(1),
      REQUEST_METHOD: req.method,
      CONTENT_TYPE: req.headers["content-type"] ?? "",
      REMOTE_USER: username,
      REMOTE_ADDR: "127.0.0.1",
      GIT_CONFIG_NOSYSTEM: "1",
    };
    if (req.headers["content-length"]) env.CONTENT_LENGTH = req.headers["content-length"];
    if (req.headers["content-encoding"]) env.HTTP_CONTENT_ENCODING = req.headers["content-encoding"];
    if (req.headers["git-protocol"]) env.GIT_PROTOCOL = String(req.headers["git-protocol"]);
    const cgi = spawn("git", ["http-backend"], { env, stdio: ["pipe", "pipe", "inherit"] });
    req.pipe(cgi.stdin);
    cgi.stdin.on("error", () => undefined);
    let head = Buffer.alloc(0);
    let headersDone = false;
    cgi.stdout.on("data", (chunk: Buffer) => {
      if (headersDone) {
        res.write(chunk);
        return;
      }
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf("\r\n\r\n");
      if (end < 0) return;
      headersDone = true;
      let status = 200;
      const headers: Record<string, string> = {};
      for (const line of head.subarray(0, end).toString("latin1").split("\r\n")) {
        const i = line.indexOf(":");
        const k = line.slice(0, i).trim();
        const v = line.slice(i + 1).trim();
        if (k.toLowerCase() === "status") status = Number.parseInt(v, 10);
        else headers[k] = v;
      }
      res.writeHead(status, headers);
      res.write(head.subarray(end + 4));
    });
    cgi.stdout.on("end", () => res.end());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seenAuth,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}
