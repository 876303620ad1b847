import { create, type MessageInitShape } from "@bufbuild/protobuf";
import type { CallOptions, Client, Transport } from "@connectrpc/connect";
import { SandboxSchema, type ListSandboxesRequest, type ListSandboxesRequestSchema, type SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { Sandbox, type CreateSandboxParams, type WaitOptions } from "./sandbox.ts";

/** The request as a plain object. */
export type ListSandboxesParams = Exclude<MessageInitShape<typeof ListSandboxesRequestSchema>, ListSandboxesRequest>;

/** The organization's sandboxes. Methods take an id or a name. */
export class Sandboxes {
  /** The generated SandboxService client (the calls not wrapped here: resize, network, previews...). */
  readonly client: Client<typeof SandboxService>;
  private readonly transport: Transport;
  private readonly defaultTarget: string | undefined;

  constructor(client: Client<typeof SandboxService>, transport: Transport, defaultTarget: string | undefined) {
    this.client = client;
    this.transport = transport;
    this.defaultTarget = defaultTarget;
  }

  private handle(info: Sandbox["info"]): Sandbox {
    return new Sandbox(info, this.client, this.transport);
  }

  /**
   * Creates a sandbox (in the configured target unless `params.target` names one) and, unless
   * `wait: false`, waits until it is started.
   */
  async create(params: CreateSandboxParams = {}, o: { wait?: boolean } & CallOptions & Pick<WaitOptions, "timeoutMs"> = {}): Promise<Sandbox> {
    const { wait = true, timeoutMs, ...opts } = o;
    const info = await this.client.createSandbox({ ...params, target: params.target ?? this.defaultTarget }, opts);
    const sandbox = this.handle(info);
    return wait ? sandbox.waitUntilStarted({ timeoutMs, signal: opts.signal }) : sandbox;
  }

  async get(idOrName: string, opts?: CallOptions): Promise<Sandbox> {
    return this.handle(await this.client.getSandbox({ sandboxId: idOrName }, opts));
  }

  /** A handle for a sandbox known by id or name, without reading it first (its `info` holds only that until refresh()). */
  handleFor(id: string): Sandbox {
    return new Sandbox(create(SandboxSchema, { id }), this.client, this.transport);
  }

  /** Sandboxes matching `params` (labels as a JSON object string, states, cursor/limit...). */
  async list(params: ListSandboxesParams = {}, opts?: CallOptions): Promise<{ items: Sandbox[]; nextCursor?: string }> {
    const res = await this.client.listSandboxes(params, opts);
    return { items: res.items.map((s) => this.handle(s)), nextCursor: res.nextCursor };
  }

  /** Every sandbox, page by page (`limit` per page). */
  async *listAll(params: Omit<ListSandboxesParams, "cursor"> = {}, opts?: CallOptions): AsyncGenerator<Sandbox> {
    let cursor: string | undefined;
    do {
      const page = await this.list({ limit: 100, ...params, cursor }, opts);
      yield* page.items;
      cursor = page.nextCursor;
    } while (cursor);
  }

  async start(idOrName: string, opts?: CallOptions): Promise<Sandbox> {
    return this.handle(await this.client.startSandbox({ sandboxId: idOrName }, opts));
  }

  async stop(idOrName: string, o: { force?: boolean } & CallOptions = {}): Promise<Sandbox> {
    const { force, ...opts } = o;
    return this.handle(await this.client.stopSandbox({ sandboxId: idOrName, force }, opts));
  }

  async archive(idOrName: string, opts?: CallOptions): Promise<Sandbox> {
    return this.handle(await this.client.archiveSandbox({ sandboxId: idOrName }, opts));
  }

  async delete(idOrName: string, o: { force?: boolean } & CallOptions = {}): Promise<Sandbox> {
    const { force, ...opts } = o;
    return this.handle(await this.client.deleteSandbox({ sandboxId: idOrName, force }, opts));
  }

  async waitUntilStarted(idOrName: string, o?: WaitOptions): Promise<Sandbox> {
    return (await this.get(idOrName, { signal: o?.signal })).waitUntilStarted(o);
  }
}
