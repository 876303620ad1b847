import type { Readable, Writable } from "node:stream";

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

/** An error answer from the language server. */
export class RpcError extends Error {
  readonly code: number;
  constructor(code: number, message: string) {
    super(message);
    this.code = code;
  }
}

/**
 * JSON-RPC 2.0 with LSP's framing (Content-Length headers) over a process's
 * stdio. Requests the server sends to us are answered by onRequest.
 */
export class JsonRpcConnection {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private buffer: Buffer = Buffer.alloc(0);
  private closedWith: Error | undefined;
  private readonly out: Writable;
  onRequest: (method: string, params: unknown) => unknown = () => {
    throw new RpcError(-32601, "method not found");
  };
  onNotification: (method: string, params: unknown) => void = () => undefined;

  constructor(input: Readable, out: Writable) {
    this.out = out;
    input.on("data", (chunk: Buffer) => this.onData(chunk));
    input.on("error", () => undefined);
    out.on("error", () => undefined);
  }

  request<T>(method: string, params: unknown, timeoutMs: number): Promise<T> {
    if (this.closedWith) return Promise.reject(this.closedWith);
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        this.send({ jsonrpc: "2.0", method: "$/cancelRequest", params: { id } });
        reject(new RpcError(-32803, `${method}: no answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, timer });
      this.send({ jsonrpc: "2.0", id, method, params: params as Json });
    });
  }

  notify(method: string, params: unknown): void {
    if (this.closedWith) throw this.closedWith;
    this.send({ jsonrpc: "2.0", method, params: params as Json });
  }

  /** Fails every pending and later request (the server went away). */
  close(reason: Error): void {
    this.closedWith ??= reason;
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(reason);
    }
    this.pending.clear();
  }

  private send(msg: Record<string, Json>): void {
    const body = Buffer.from(JSON.stringify(msg), "utf8");
    this.out.write(Buffer.concat([Buffer.from(`Content-Length: ${body.length}\r\n\r\n`, "ascii"), body]));
  }

  private onData(chunk: Buffer): void {
    this.buffer = this.buffer.length ? Buffer.concat([this.buffer, chunk]) : chunk;
    for (;;) {
      const headerEnd = this.buffer.indexOf("\r\n\r\n");
      if (headerEnd < 0) return;
      const header = this.buffer.subarray(0, headerEnd).toString("ascii");
      const m = /Content-Length:\s*(\d+)/i.exec(header);
      if (!m) {
        // Not LSP framing: drop the garbage up to the separator and go on.
        this.buffer = this.buffer.subarray(headerEnd + 4);
        continue;
      }
      const length = Number(m[1]);
      if (this.buffer.length < headerEnd + 4 + length) return;
      const body = this.buffer.subarray(headerEnd + 4, headerEnd + 4 + length).toString("utf8");
      this.buffer = this.buffer.subarray(headerEnd + 4 + length);
      try {
        this.dispatch(JSON.parse(body) as Record<string, unknown>);
      } catch {
        // A malformed message from the server is ignored.
      }
    }
  }

  private dispatch(msg: Record<string, unknown>): void {
    if (typeof msg.method === "string") {
      if (msg.id === undefined) {
        this.onNotification(msg.method, msg.params);
        return;
      }
      let result: unknown;
      try {
        result = this.onRequest(msg.method, msg.params);
        this.send({ jsonrpc: "2.0", id: msg.id as Json, result: (result ?? null) as Json });
      } catch (err) {
        const code = err instanceof RpcError ? err.code : -32603;
        this.send({ jsonrpc: "2.0", id: msg.id as Json, error: { code, message: (err as Error).message } });
      }
      return;
    }
    const p = this.pending.get(msg.id as number);
    if (!p) return;
    this.pending.delete(msg.id as number);
    clearTimeout(p.timer);
    const error = msg.error as { code?: number; message?: string } | undefined;
    if (error) p.reject(new RpcError(error.code ?? -32603, error.message ?? "language server error"));
    else p.resolve(msg.result);
  }
}
