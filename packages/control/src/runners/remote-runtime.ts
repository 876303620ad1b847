import { createHash } from "node:crypto";
import http2 from "node:http2";
import { Readable } from "node:stream";
import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { type Client, createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { Code, ConnectError, errors } from "@sandbar/protocol";
import {
  type BuildSnapshotRequest,
  Compression,
  type LogChunk,
  type SnapshotProgress,
  RestoreSandboxRequestSchema,
  type RestoreSandboxRequest,
  type RunnerInfo,
  RunnerService,
  RunnerSnapshotService,
} from "@sandbar/protocol/gen/sandbar/runner/v1/runner_pb.js";
import type { RegistryCredentials } from "@sandbar/runner/images";
import type { LayerExport } from "@sandbar/runner/runtime";
import { AGENT_API_PATH, AGENT_TUNNEL_PATH, openAgentStream } from "@sandbar/runner/daemon";
import { AgentRelay } from "./agent-relay.ts";
import { changesPartFromProto, networkToProto, resourcesToProto, specToProto, statusFromProto } from "@sandbar/runner/daemon";
import type { ChangesPart, ChangesQuery } from "@sandbar/runner";
import type { AgentDial, RuntimeNetwork, RuntimeResources, RuntimeSandbox, RuntimeSandboxSpec, SandboxRuntime } from "../sandboxes/runtime.ts";

// A runner process reached over its port: RunnerService for the lifecycle, and HTTP/2 byte
// streams for agent traffic (the runner package's daemon/agent-streams.ts). The runner's errors arrive as the
// ConnectErrors it raised (same code, same message), so callers see what a local runtime says.

export interface RemoteRuntimeOptions {
  /** `http://host:port` (h2c) or `https://host:port` (TLS). */
  url: string;
  /** The runner's credential. */
  credential: string;
  /** PEM of the CA that signed the runner's certificate (TLS); default: the system's. */
  ca?: string;
  /** Bound on one lifecycle call (a create waits for the agent). */
  timeoutMs?: number;
}

const STREAM_WINDOW = 4 * 1024 * 1024;
const SESSION_WINDOW = 32 * 1024 * 1024;

export class RemoteRuntime implements SandboxRuntime {
  readonly runnerId: string;
  readonly agentsOnThisHost = false;
  readonly url: string;
  readonly #client: Client<typeof RunnerService>;
  readonly #snapshots: Client<typeof RunnerSnapshotService>;
  readonly #rpcSessions: Http2SessionManager;
  readonly #credential: string;
  readonly #ca?: string;
  readonly #timeoutMs: number;
  /** Agent secrets and keys by sandbox, forgotten whenever this process changes the sandbox's run. */
  readonly #access = new Map<string, Promise<{ secret: string; key: string }>>();
  #streams: http2.ClientHttp2Session | undefined;
  /** Made on the first agent connection (a health check's client never needs one). */
  #relay: Promise<AgentRelay> | undefined;

  private constructor(o: RemoteRuntimeOptions, runnerId: string, client: Client<typeof RunnerService>, snapshots: Client<typeof RunnerSnapshotService>, sessions: Http2SessionManager) {
    this.url = o.url;
    this.runnerId = runnerId;
    this.#client = client;
    this.#snapshots = snapshots;
    this.#rpcSessions = sessions;
    this.#credential = o.credential;
    this.#ca = o.ca;
    this.#timeoutMs = o.timeoutMs ?? 120_000;
  }

  /** Connects and asks the runner who it is (fails when the runner cannot be reached or refuses the credential). */
  static async open(o: RemoteRuntimeOptions): Promise<RemoteRuntime> {
    const nodeOptions = { ...(o.ca ? { ca: o.ca } : {}), settings: { initialWindowSize: STREAM_WINDOW } };
    const sessions = new Http2SessionManager(o.url, { pingIntervalMs: 10_000, pingTimeoutMs: 10_000, idleConnectionTimeoutMs: 300_000 }, nodeOptions);
    const auth: Interceptor = (next) => (req) => {
      req.header.set("authorization", `Bearer ${o.credential}`);
      return next(req);
    };
    const transport = createGrpcTransport({ baseUrl: o.url, sessionManager: sessions, interceptors: [auth] });
    const client = createClient(RunnerService, transport);
    const info = await client.getRunnerInfo({}, { timeoutMs: Math.min(10_000, o.timeoutMs ?? 10_000) });
    if (!info.id) throw new Error(`the runner at ${o.url} did not say its id`);
    return new RemoteRuntime(o, info.id, client, createClient(RunnerSnapshotService, transport), sessions);
  }

  #opts() {
    return { timeoutMs: this.#timeoutMs };
  }

  info(): Promise<RunnerInfo> {
    return this.#client.getRunnerInfo({}, { timeoutMs: Math.min(10_000, this.#timeoutMs) });
  }

  async assertReady(): Promise<void> {
    const info = await this.info().catch((err: unknown) => {
      throw errors.unavailable(`The runner at ${this.url} cannot be reached: ${err instanceof Error ? err.message : String(err)}`);
    });
    const sick = info.services.find((s) => !s.healthy);
    if (sick) throw errors.unavailable(sick.reason || `the runner's ${sick.name} service is unhealthy`);
  }

  /** Whether the runner's image store holds the image with this manifest digest. */
  async holdsImage(digest: string): Promise<boolean> {
    try {
      await this.#snapshots.getSnapshotInfo({ ref: digest }, { timeoutMs: 10_000 });
      return true;
    } catch (err) {
      if (err instanceof ConnectError && err.code === Code.NotFound) return false;
      throw err;
    }
  }

  /** Manifest digests of the images the runner holds. */
  async heldImages(): Promise<string[]> {
    return (await this.#snapshots.listSnapshots({}, { timeoutMs: 10_000 })).snapshots.map((s) => s.ref);
  }

  /** Drops the image from the runner's store (refused while one of its sandboxes boots from it). */
  async removeImage(digest: string): Promise<void> {
    await this.#snapshots.removeSnapshot({ ref: digest }, { timeoutMs: 60_000 });
  }

  /**
   * Has the runner pull `name` (pinned to `digest`) unless it holds it; the credentials go with this
   * call only. Concurrent pulls of one image on the runner are one pull (its image store's lock).
   */
  async pullImage(digest: string, name: string, credentials?: RegistryCredentials, onProgress?: (line: string) => void): Promise<void> {
    const auth = credentials && { url: "", username: credentials.username, password: credentials.password };
    // A pull is bounded by the image's size, not by a lifecycle call's timeout.
    for await (const event of this.#snapshots.pullSnapshot({ ref: digest, image: name, ...(auth ? { auth } : {}) })) {
      if (event.event.case === "log") onProgress?.(Buffer.from(event.event.value.data).toString().trimEnd());
      else if (event.event.case === "done") return;
    }
    throw errors.unavailable(`the runner at ${this.url} ended the pull of ${name} without its result`);
  }

  /** The runner builds: the request stream (spec, then contexts' bytes) goes to it as control reads it; a build is bounded by the caller's signal (its time limit), not a lifecycle timeout. */
  buildSnapshot(requests: AsyncIterable<BuildSnapshotRequest>, signal: AbortSignal): AsyncIterable<SnapshotProgress> {
    return this.#snapshots.buildSnapshot(requests, { signal });
  }

  snapshotLogs(ref: string, follow: boolean, signal: AbortSignal): AsyncIterable<LogChunk> {
    return this.#snapshots.getSnapshotLogs({ ref, follow }, { signal });
  }

  async create(spec: RuntimeSandboxSpec): Promise<void> {
    this.#access.delete(spec.id);
    await this.#client.createSandbox({ spec: specToProto(spec) }, this.#opts());
  }

  async start(id: string): Promise<void> {
    this.#access.delete(id);
    await this.#client.startSandbox({ id }, this.#opts());
  }

  async stop(id: string, options: { force?: boolean } = {}): Promise<void> {
    this.#access.delete(id);
    await this.#client.stopSandbox({ id, force: options.force ?? false }, this.#opts());
  }

  async pause(id: string): Promise<void> {
    await this.#client.pauseSandbox({ id }, this.#opts());
  }

  async resume(id: string): Promise<void> {
    await this.#client.resumeSandbox({ id }, this.#opts());
  }

  async destroy(id: string): Promise<void> {
    this.#access.delete(id);
    await this.#client.destroySandbox({ id }, this.#opts());
  }

  async setEnv(id: string, env: Record<string, string>): Promise<void> {
    await this.#client.setSandboxEnv({ id, env }, this.#opts());
  }

  async setNetwork(id: string, network: RuntimeNetwork): Promise<void> {
    await this.#client.setSandboxNetwork({ id, network: networkToProto(network) }, this.#opts());
  }

  async resize(id: string, resources: RuntimeResources): Promise<void> {
    await this.#client.resizeSandbox({ id, resources: resourcesToProto(resources) }, this.#opts());
  }

  async captureLayer(id: string, layerId: string): Promise<void> {
    await this.#client.captureLayer({ id, layerId }, this.#opts());
  }

  async squashLayers(layerIds: string[], layerId: string): Promise<void> {
    await this.#client.squashLayers({ layerIds, layerId }, this.#opts());
  }

  async removeLayers(layerIds: string[]): Promise<void> {
    await this.#client.removeLayers({ layerIds }, this.#opts());
  }

  /** The runner exports and pushes itself (the credentials go with this call only); bounded by the image's size, not a lifecycle timeout. */
  async exportLayers(req: LayerExport): Promise<{ digest: string; layers: number; bytes: number }> {
    const c = req.push.credentials;
    const out = await this.#client.exportLayers({ layerIds: req.layers, image: req.image ?? "", user: req.user, destination: req.push.image, ...(c ? { auth: { url: "", username: c.username, password: c.password } } : {}) });
    return { digest: out.digest, layers: out.layers, bytes: Number(out.bytes) };
  }

  async listLayers(): Promise<Array<{ id: string; createdAt: Date }>> {
    const { layers } = await this.#client.listLayers({}, this.#opts());
    return layers.map((l) => ({ id: l.id, createdAt: l.createdAt ? timestampDate(l.createdAt) : new Date(0) }));
  }

  /** The runner's pack stream as bytes; the stream fails at its end unless the trailer matches what came. */
  async pack(id: string): Promise<Readable> {
    const parts = this.#client.packSandbox({ id, compression: Compression.NONE })[Symbol.asyncIterator]();
    // The first part is the header: waiting for it surfaces the runner's refusal (unknown id, started) here.
    const first = await parts.next();
    if (first.done || first.value.part.case !== "header") throw errors.internal(`the runner at ${this.url} sent no archive header`);
    return Readable.from(
      (async function* () {
        const hash = createHash("sha256");
        let size = 0n;
        for (let r = await parts.next(); !r.done; r = await parts.next()) {
          const part = r.value.part;
          if (part.case === "data") {
            hash.update(part.value);
            size += BigInt(part.value.length);
            yield Buffer.from(part.value.buffer, part.value.byteOffset, part.value.byteLength);
          } else if (part.case === "trailer") {
            if (part.value.sizeBytes !== size || part.value.sha256 !== hash.digest("hex")) throw new Error(`the archive from the runner does not match its trailer (${size} bytes)`);
            return;
          }
        }
        throw new Error("the runner's archive ended without its trailer");
      })(),
      { objectMode: false },
    );
  }

  /** The runner's changeset read, part by part; leaving the loop ends the runner's read. */
  async *changes(id: string, query: ChangesQuery): AsyncGenerator<ChangesPart> {
    const req = { id, format: query.format, pathPrefix: query.prefix ?? "", after: query.after ?? "", consistent: query.consistent ?? false, since: query.since ?? [] };
    for await (const p of this.#client.getSandboxChanges(req)) {
      const part = changesPartFromProto(p);
      if (part) yield part;
    }
  }

  async restore(spec: RuntimeSandboxSpec, archive: Readable): Promise<void> {
    this.#access.delete(spec.id);
    const message = (part: RestoreSandboxRequest["part"]) => create(RestoreSandboxRequestSchema, { part });
    async function* requests(): AsyncGenerator<RestoreSandboxRequest> {
      yield message({ case: "header", value: { $typeName: "sandbar.runner.v1.RestoreHeader", spec: specToProto(spec), archive: { $typeName: "sandbar.runner.v1.ArchiveHeader", compression: Compression.NONE, snapshotRef: "", estimatedSizeBytes: 0n }, start: false } });
      const hash = createHash("sha256");
      let size = 0n;
      for await (const chunk of archive as AsyncIterable<Buffer>) {
        hash.update(chunk);
        size += BigInt(chunk.length);
        yield message({ case: "data", value: chunk });
      }
      yield message({ case: "trailer", value: { $typeName: "sandbar.runner.v1.ArchiveTrailer", sizeBytes: size, sha256: hash.digest("hex") } });
    }
    await this.#client.restoreSandbox(requests(), this.#opts());
  }

  async list(): Promise<RuntimeSandbox[]> {
    return (await this.#client.listSandboxes({}, this.#opts())).sandboxes.map(statusFromProto);
  }

  async inspect(id: string): Promise<RuntimeSandbox | undefined> {
    try {
      return statusFromProto(await this.#client.inspectSandbox({ id }, this.#opts()));
    } catch (err) {
      if (err instanceof ConnectError && err.code === Code.NotFound) return undefined;
      throw err;
    }
  }

  async connectAgent(id: string): Promise<AgentDial> {
    let access = this.#access.get(id);
    // Asked again unless the connection to the runner is up: a runner that went away answers UNAVAILABLE here, with the reason.
    const state = this.#rpcSessions.state();
    if (!access || !(state === "open" || state === "idle" || state === "verifying")) {
      access = this.#client.getAgentAccess({ id }, { timeoutMs: 10_000 }).then((a) => ({ secret: a.secret, key: a.key }));
      this.#access.set(id, access);
      if (this.#access.size > 10_000) this.#access.delete(this.#access.keys().next().value!);
      access.catch(() => this.#access.delete(id));
    }
    const { secret, key } = await access;
    this.#relay ??= AgentRelay.start((sandboxId) => openAgentStream(this.#session(), AGENT_API_PATH, sandboxId, this.#credential));
    const relay = await this.#relay;
    return {
      key: `${this.url}#${key}`,
      secret,
      // A real socket (agent-relay.ts) under the agent's HTTP/2 clients.
      api: () => relay.connect(id),
      tunnel: () => openAgentStream(this.#session(), AGENT_TUNNEL_PATH, id, this.#credential),
    };
  }

  /** The HTTP/2 connection agent streams ride on; a new one once it closed or failed. */
  #session(): http2.ClientHttp2Session {
    const s = this.#streams;
    if (s && !s.closed && !s.destroyed) return s;
    const session = http2.connect(this.url, { ...(this.#ca ? { ca: this.#ca } : {}), settings: { initialWindowSize: STREAM_WINDOW } });
    session.on("error", () => undefined); // each stream reports its own failure
    session.once("connect", () => session.setLocalWindowSize(SESSION_WINDOW));
    session.once("close", () => {
      if (this.#streams === session) this.#streams = undefined;
    });
    session.once("goaway", () => {
      if (this.#streams === session) this.#streams = undefined;
    });
    // No open stream: no reason to keep the process alive.
    session.unref();
    this.#streams = session;
    return session;
  }

  async close(): Promise<void> {
    this.#rpcSessions.abort();
    await this.#relay?.then((r) => r.close(), () => undefined);
    this.#streams?.close();
    this.#streams = undefined;
  }
}
