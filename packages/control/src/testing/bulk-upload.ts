import { randomBytes } from "node:crypto";
import http from "node:http";

const MIB = 2 ** 20;

export interface BulkUpload {
  /** The control server's base URL. */
  url: string;
  key: string;
  sandboxId: string;
  /** Where the file goes in the sandbox. */
  dest: string;
  mib: number;
  /** The i-th MiB of the file (exactly 1 MiB). */
  chunk: (i: number) => Buffer;
  agent?: http.Agent;
}

/**
 * One REST multipart bulk-upload (`files[0].path`, `files[0].file`), streamed with back-pressure
 * (never more than a few chunks in memory): resolves to the answer's body, rejects on any status
 * but 200. For tests and benchmarks.
 */
export function bulkUpload(o: BulkUpload): Promise<string> {
  const boundary = "----sandbar" + randomBytes(8).toString("hex");
  const head = Buffer.from(
    `--${boundary}\r\nContent-Disposition: form-data; name="files[0].path"\r\n\r\n${o.dest}\r\n` +
      `--${boundary}\r\nContent-Disposition: form-data; name="files[0].file"; filename="upload.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`,
  );
  const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
  const url = new URL(o.url);
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: url.hostname,
        port: url.port,
        method: "POST",
        path: `/api/toolbox/${o.sandboxId}/toolbox/files/bulk-upload`,
        agent: o.agent,
        headers: { authorization: `Bearer ${o.key}`, "content-type": `multipart/form-data; boundary=${boundary}`, "content-length": head.length + o.mib * MIB + tail.length },
      },
      (res) => {
        let body = "";
        res.on("data", (c: Buffer) => (body += c.toString()));
        res.on("end", () => (res.statusCode === 200 ? resolve(body) : reject(new Error(`bulk-upload answered ${res.statusCode}: ${body}`))));
      },
    );
    req.on("error", reject);
    let sent = 0;
    const pump = () => {
      while (sent < o.mib) {
        if (!req.write(o.chunk(sent++))) return void req.once("drain", pump);
      }
      req.end(tail);
    };
    req.write(head);
    pump();
  });
}
