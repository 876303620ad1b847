import { createHash, randomBytes } from "node:crypto";
import { IncomingMessage } from "node:http";
import { Socket } from "node:net";
import busboy from "busboy";
import { describe, expect, it } from "vitest";
import { formParts } from "./multipart-parts.ts";

// The multipart parser against busboy (which it replaced, and which the SDKs' own tests use) on
// the same bodies, cut into reads at every kind of place: inside a delimiter, right after a CR,
// inside a part's headers. The request is node's IncomingMessage fed those reads one by one (not
// through a socket): the cut points are the point, and a socket would merge them. The real
// HTTP path is covered by transfer.test.ts, upload-errors.test.ts and the SDK suites.

interface Seen {
  kind: "field" | "file";
  name: string;
  filename?: string;
  sha256: string;
  size: number;
  truncated?: boolean;
}

const hash = (chunks: Buffer[]) => chunks.reduce((h, c) => h.update(c), createHash("sha256")).digest("hex");

function request(contentType: string, reads: Buffer[], complete = true): IncomingMessage {
  // A request of node's own, on a socket that never connects: its body is `reads`, one per read.
  const req = new IncomingMessage(new Socket());
  req.headers = { "content-type": contentType };
  const next = reads[Symbol.iterator]();
  req._read = () => {
    const read = next.next();
    req.push(read.done ? null : read.value);
  };
  req.on("end", () => (req.complete = complete));
  return req;
}

async function ours(contentType: string, reads: Buffer[]): Promise<Seen[]> {
  const seen: Seen[] = [];
  for await (const part of formParts(request(contentType, reads))) {
    if (part.kind === "field") {
      const b = Buffer.from(part.value, "utf8");
      seen.push({ kind: "field", name: part.name, sha256: hash([b]), size: b.length, truncated: part.truncated });
    } else {
      const chunks: Buffer[] = [];
      for await (const c of part.chunks) chunks.push(Buffer.from(c));
      seen.push({ kind: "file", name: part.name, filename: part.filename, sha256: hash(chunks), size: chunks.reduce((n, c) => n + c.length, 0) });
    }
  }
  return seen;
}

function theirs(contentType: string, body: Buffer): Promise<Seen[]> {
  return new Promise((resolve, reject) => {
    const seen: Seen[] = [];
    const bb = busboy({ headers: { "content-type": contentType }, preservePath: true });
    bb.on("field", (name, value, info) => {
      const b = Buffer.from(value, "utf8");
      seen.push({ kind: "field", name, sha256: hash([b]), size: b.length, truncated: info.valueTruncated });
    });
    bb.on("file", (name, stream, info) => {
      const chunks: Buffer[] = [];
      const entry: Seen = { kind: "file", name, filename: info.filename, sha256: "", size: 0 };
      seen.push(entry);
      stream.on("data", (c: Buffer) => chunks.push(c));
      stream.on("end", () => Object.assign(entry, { sha256: hash(chunks), size: chunks.reduce((n, c) => n + c.length, 0) }));
    });
    bb.on("close", () => resolve(seen));
    bb.on("error", reject);
    bb.end(body);
  });
}

/** A body as the SDKs and curl write them, with content that tempts the search (CRs, dashes, a near-boundary). */
function form(boundary: string): Buffer {
  const near = Buffer.from(`\r\n--${boundary.slice(0, -1)}X`);
  const tricky = Buffer.concat([randomBytes(70_000), Buffer.from("\r\n--\r\r\n"), near, randomBytes(5000), Buffer.from("\r")]);
  const parts: Buffer[] = [
    Buffer.from(`preamble to ignore\r\n--${boundary}\r\nContent-Disposition: form-data; name="files[0].path"\r\n\r\n/home/x/a b.txt\r\n`),
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="files[0].file"; filename="a b.txt"\r\nContent-Type: application/octet-stream\r\n\r\n`),
    tricky,
    Buffer.from(`\r\n--${boundary}\r\ncontent-disposition: form-data;\r\n name="files[1].file"; filename*=utf-8''%C3%A9t%C3%A9.txt\r\n\r\n`),
    Buffer.alloc(0),
    Buffer.from(`\r\n--${boundary}\r\nContent-Disposition: form-data; name="raw"\r\nContent-Type: application/octet-stream\r\n\r\n`),
    randomBytes(3000),
    Buffer.from(`\r\n--${boundary}\r\nContent-Disposition: attachment; name="not-form-data"\r\n\r\nskipped\r\n`),
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="text"\r\n\r\nplain \u00e9 text\r\n`),
    Buffer.from(`--${boundary}--\r\nepilogue`),
  ];
  return Buffer.concat(parts);
}

/** The body cut at the given offsets. */
const cut = (body: Buffer, at: number[]) => [0, ...at, body.length].slice(1).map((end, i, ends) => body.subarray(i === 0 ? 0 : ends[i - 1], end));

describe("formParts", () => {
  const boundary = "----sandbar" + randomBytes(8).toString("hex");
  const contentType = `multipart/form-data; boundary=${boundary}`;

  it("reads what busboy reads, whole or cut into reads anywhere (inside delimiters, after a CR, inside headers)", async () => {
    const body = form(boundary);
    const expected = await theirs(contentType, body);
    expect(expected.map((p) => p.name)).toEqual(["files[0].path", "files[0].file", "files[1].file", "raw", "text"]);
    expect(await ours(contentType, [body])).toEqual(expected);
    // The boundary quoted, after another parameter, the type in capitals.
    const quoted = `Multipart/Form-Data; charset=utf-8; boundary="${boundary}"`;
    expect(await theirs(quoted, body)).toEqual(expected);
    expect(await ours(quoted, [body])).toEqual(expected);
    // Every cut around each delimiter and CR, one at a time, then random reads of 1 byte to 64 KiB.
    const marks: number[] = [];
    for (let i = body.indexOf("\r"); i >= 0; i = body.indexOf("\r", i + 1)) marks.push(i);
    for (const m of marks) for (const d of [-1, 0, 1, 2, 3, 5, 9, boundary.length + 3]) {
      const at = m + d;
      if (at > 0 && at < body.length) expect(await ours(contentType, cut(body, [at]))).toEqual(expected);
    }
    for (let round = 0; round < 20; round++) {
      const at: number[] = [];
      for (let p = 1 + Math.floor(Math.random() * 50); p < body.length; p += 1 + Math.floor(Math.random() * (round % 2 ? 64 : 65536))) at.push(p);
      expect(await ours(contentType, cut(body, at))).toEqual(expected);
    }
  });

  it("keeps a file part's reads as they came: slices, not copies", async () => {
    const content = randomBytes(200_000);
    const head = Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="f"; filename="f"\r\n\r\n`);
    const reads = [head, content.subarray(0, 100_000), content.subarray(100_000), Buffer.from(`\r\n--${boundary}--\r\n`)];
    for await (const part of formParts(request(contentType, reads))) {
      if (part.kind !== "file") continue;
      const got: Buffer[] = [];
      for await (const c of part.chunks) got.push(c);
      expect(got.map((c) => c.buffer === content.buffer)).toEqual([true, true]);
      expect(Buffer.concat(got).equals(content)).toBe(true);
    }
  });

  it("skips a part its consumer left unread, and one it stopped reading", async () => {
    const body = form(boundary);
    const names: string[] = [];
    for await (const part of formParts(request(contentType, cut(body, [100, 20_000, 70_100])))) {
      names.push(part.name);
      if (part.kind === "file") for await (const _ of part.chunks) break;
    }
    expect(names).toEqual(["files[0].path", "files[0].file", "files[1].file", "raw", "text"]);
  });

  it("cuts a text field at 1 MiB, as busboy did", async () => {
    const big = Buffer.alloc(1024 * 1024 + 10, "a");
    const body = Buffer.concat([Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="t"\r\n\r\n`), big, Buffer.from(`\r\n--${boundary}--`)]);
    const got = await ours(contentType, cut(body, [70_000, 500_000]));
    expect(got).toEqual(await theirs(contentType, body));
    expect(got[0]).toMatchObject({ size: 1024 * 1024, truncated: true });
  });

  it("answers a broken body with the client's error, naming the problem", async () => {
    const body = form(boundary);
    const fail = async (type: string, reads: Buffer[], complete = true) => {
      try {
        for await (const part of formParts(request(type, reads, complete))) if (part.kind === "file") for await (const _ of part.chunks) void _;
      } catch (err) {
        return { code: (err as { code?: number }).code, message: (err as Error).message };
      }
      return undefined;
    };
    // 3 = invalid argument (a 400)
    expect(await fail(contentType, [body.subarray(0, body.length - 1000)])).toEqual({ code: 3, message: expect.stringMatching(/Malformed multipart\/form-data body: Unexpected end of form/) });
    expect(await fail(contentType, [body.subarray(0, body.length - 1000)], false)).toEqual({ code: 3, message: expect.stringMatching(/Malformed multipart\/form-data body: (Unexpected end of form|the upload was interrupted)/) });
    expect(await fail(contentType, [Buffer.from(`--${boundary}\r\nno colon here\r\n\r\nx\r\n--${boundary}--`)])).toEqual({ code: 3, message: expect.stringMatching(/Malformed part header/) });
    // A part without headers: busboy refused it too.
    expect(await fail(contentType, [Buffer.from(`--${boundary}\r\n\r\nx\r\n--${boundary}--`)])).toEqual({ code: 3, message: expect.stringMatching(/Malformed part header/) });
    expect(await fail(contentType, [Buffer.from(`--${boundary}\r\nX-Long: ${"a".repeat(20_000)}\r\n\r\nx\r\n--${boundary}--`)])).toEqual({ code: 3, message: expect.stringMatching(/Malformed part header/) });
    expect(await fail("application/json", [Buffer.from("{}")])).toEqual({ code: 3, message: expect.stringMatching(/Expected a multipart\/form-data body/) });
    expect(await fail("multipart/form-data", [Buffer.from("{}")])).toEqual({ code: 3, message: expect.stringMatching(/Boundary not found/) });
  });
});
