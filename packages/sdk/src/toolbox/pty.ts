import type { CallOptions, Client } from "@connectrpc/connect";
import type { PtyEvent, PtyService, PtySessionInfo } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";

export interface PtyCreateOptions extends CallOptions {
  /** Session id (default: a random one). */
  id?: string;
  cwd?: string;
  env?: Record<string, string>;
  cols?: number;
  rows?: number;
}

/** One terminal in a sandbox: write to it, resize it, read what it prints. */
export class PtyHandle {
  readonly id: string;
  private readonly client: Client<typeof PtyService>;

  constructor(id: string, client: Client<typeof PtyService>) {
    this.id = id;
    this.client = client;
  }

  /** Keystrokes or text for the terminal. */
  async input(data: string | Uint8Array, opts?: CallOptions): Promise<void> {
    await this.client.sendPtyInput({ sessionId: this.id, data: typeof data === "string" ? new TextEncoder().encode(data) : data }, opts);
  }

  resize(cols: number, rows: number, opts?: CallOptions): Promise<PtySessionInfo> {
    return this.client.resizePty({ sessionId: this.id, cols, rows }, opts);
  }

  /** The terminal's events: `connected`, then `data` as it prints, and `exit` last when its shell ends. */
  events(opts?: CallOptions): AsyncIterable<PtyEvent> {
    return this.client.connectPty({ sessionId: this.id }, opts);
  }

  /** Only what the terminal prints; ends when its shell exits. */
  async *output(opts?: CallOptions): AsyncGenerator<Uint8Array> {
    for await (const e of this.events(opts)) if (e.event.case === "data") yield e.event.value;
  }

  info(opts?: CallOptions): Promise<PtySessionInfo> {
    return this.client.getPty({ sessionId: this.id }, opts);
  }

  /** Ends the terminal and its processes. */
  async kill(opts?: CallOptions): Promise<void> {
    await this.client.deletePty({ sessionId: this.id }, opts);
  }
}

/** Terminals of one sandbox. */
export class Ptys {
  /** The generated PtyService client for this sandbox. */
  readonly client: Client<typeof PtyService>;

  constructor(client: Client<typeof PtyService>) {
    this.client = client;
  }

  async create(o: PtyCreateOptions = {}): Promise<PtyHandle> {
    const { id = `pty-${crypto.randomUUID()}`, cwd, env, cols, rows, ...opts } = o;
    const res = await this.client.createPty({ id, cwd, envs: env, cols, rows }, opts);
    return new PtyHandle(res.sessionId || id, this.client);
  }

  /** A handle on an existing terminal. */
  get(id: string): PtyHandle {
    return new PtyHandle(id, this.client);
  }

  async list(opts?: CallOptions): Promise<PtySessionInfo[]> {
    return (await this.client.listPty({}, opts)).sessions;
  }
}
