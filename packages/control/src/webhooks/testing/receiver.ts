import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from "node:http";
import { isIP, type AddressInfo } from "node:net";

/** One request a receiver got, with the status it answered (undefined: left hanging). */
export interface Received {
  id: string;
  headers: IncomingHttpHeaders;
  body: string;
  status?: number;
  at: number;
}

/**
 * A webhook receiver on 127.0.0.1, or the address `start` is given (a real HTTP server): records every request and answers what
 * `answer` says, a status or "hang" (no answer until the receiver closes).
 */
export class Receiver {
  readonly got: Received[] = [];
  answer: (r: Received, nth: number) => number | "hang" = () => 200;
  url = "";
  private server?: Server;
  private hanging: ServerResponse[] = [];
  private waiters: Array<() => void> = [];

  async start(host = "127.0.0.1"): Promise<this> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const r: Received = { id: String(req.headers["webhook-id"]), headers: req.headers, body: Buffer.concat(chunks).toString("utf8"), at: Date.now() };
        const nth = this.got.filter((g) => g.id === r.id).length + 1;
        const a = this.answer(r, nth);
        this.got.push(r);
        if (a === "hang") this.hanging.push(res);
        else {
          r.status = a;
          res.writeHead(a, { "content-type": "text/plain" }).end(a < 300 ? "ok" : "receiver says no");
        }
        for (const w of this.waiters.splice(0)) w();
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, host, resolve));
    this.url = `http://${isIP(host) === 6 ? `[${host}]` : host}:${(this.server.address() as AddressInfo).port}/hook`;
    return this;
  }

  /** Requests answered with a 2xx. */
  accepted(): Received[] {
    return this.got.filter((g) => g.status !== undefined && g.status < 300);
  }

  /** Resolves once `test` holds over what was received (checked on each request), or fails after `ms`. */
  async until(what: string, test: () => boolean, ms = 20_000): Promise<void> {
    const end = Date.now() + ms;
    while (!test()) {
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}; received: ${JSON.stringify(this.got.map((g) => [g.id, g.status, g.body]))}`);
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 200);
      });
    }
  }

  async close(): Promise<void> {
    for (const res of this.hanging) res.destroy();
    this.server?.closeAllConnections();
    await new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
  }
}
