import { create } from "@bufbuild/protobuf";
import { errors } from "@sandbar/protocol";
import { type BuildSnapshotRequest, BuildSnapshotRequestSchema, BuildSpecSchema, type RegistryAuth, RegistryAuthSchema } from "@sandbar/protocol/gen/sandbar/runner/v1/runner_pb.js";
import { BuildFailed, fromRegistries, parseImageRef, type RegistryCredentials } from "@sandbar/runner/images";
import type { BuildContexts } from "../object-storage/index.ts";
import type { CredentialsFor } from "../snapshots/credentials-for.ts";
import type { BuildTargets, BuildWhere } from "./build-targets.ts";
import { type BuildInfoRecord, refHex } from "./build-info.ts";

// Dispatches a declarative build to the host that runs it (a registered runner picked like
// placement, or this process's own runtime: one call, `buildSnapshot`, either way) and follows it
// live. Control streams the organization's contexts from object storage into the call and hands
// over, for this build only, the FROM registries' credentials and a push account for the internal
// registry, where the built image goes so that every runner can pull it. Keyed by organization
// and build ref: the same build of one organization runs once (joined while it runs, and the
// runner's store answers an earlier one from its cache); another organization builds its own.

export interface BuildRun {
  signal?: AbortSignal;
  onProgress?: (line: string) => void;
  /** Where to build: a given runner (a sandbox's), else one of the region's (default: the organization's). */
  where?: BuildWhere;
  /** Told the runner the build goes to, before it starts there. */
  onRunner?: (runnerId: string) => Promise<void>;
}

/** A built image: its manifest digest, size, entrypoint and cmd, and the runner that holds it. */
export interface BuiltImage {
  digest: string;
  size: number;
  entrypoint: string[];
  cmd: string[];
  runnerId: string;
}

/** The internal registry's repository for a build and an account that may push it; undefined: no internal registry. */
export type PushTarget = (organizationId: string, info: BuildInfoRecord) => Promise<{ image: string; credentials: RegistryCredentials } | undefined>;

interface Job {
  done: Promise<BuiltImage>;
  lines: string[];
  listeners: Set<(line: string) => void>;
}

export class Builder {
  readonly #targets: BuildTargets;
  readonly #contexts: BuildContexts;
  readonly #credentialsFor: CredentialsFor;
  readonly #mirror: string | undefined;
  readonly #timeoutMs: number;
  readonly #push: PushTarget | undefined;
  readonly #held: ((runnerId: string, digest: string) => Promise<void>) | undefined;
  readonly #running = new Map<string, Job>();

  /** `timeoutMs`: a build running longer is stopped (the reference's BUILD_TIMEOUT_MIN: 120 minutes). */
  constructor(o: { targets: BuildTargets; contexts: BuildContexts; credentialsFor: CredentialsFor; mirror?: string; timeoutMs?: number; push?: PushTarget; held?: (runnerId: string, digest: string) => Promise<void> }) {
    this.#timeoutMs = o.timeoutMs ?? 120 * 60_000;
    this.#targets = o.targets;
    this.#contexts = o.contexts;
    this.#credentialsFor = o.credentialsFor;
    this.#mirror = o.mirror;
    this.#push = o.push;
    this.#held = o.held;
  }

  static key(organizationId: string, info: BuildInfoRecord): string {
    return `${organizationId}-${refHex(info.snapshotRef)}`;
  }

  async build(organizationId: string, info: BuildInfoRecord, run: BuildRun = {}): Promise<BuiltImage> {
    const key = Builder.key(organizationId, info);
    let job = this.#running.get(key);
    if (job) run.onProgress?.(`joining the running build ${key}`);
    else {
      const lines: string[] = [];
      const listeners = new Set<(line: string) => void>();
      const emit = (line: string) => {
        lines.push(line);
        for (const l of listeners) l(line);
      };
      const done = this.#run(organizationId, info, key, run, emit).finally(() => this.#running.delete(key));
      this.#running.set(key, (job = { done, lines, listeners }));
    }
    for (const line of job.lines) run.onProgress?.(line);
    if (run.onProgress) job.listeners.add(run.onProgress);
    try {
      return await job.done;
    } finally {
      if (run.onProgress) job.listeners.delete(run.onProgress);
    }
  }

  async #run(organizationId: string, info: BuildInfoRecord, key: string, run: BuildRun, emit: (line: string) => void): Promise<BuiltImage> {
    const timeout = AbortSignal.timeout(this.#timeoutMs);
    const signal = run.signal ? AbortSignal.any([run.signal, timeout]) : timeout;
    const sourceRegistries: RegistryAuth[] = [];
    for (const host of fromRegistries(info.dockerfileContent, this.#mirror)) {
      const c = await this.#credentialsFor(organizationId, host);
      if (c) sourceRegistries.push(create(RegistryAuthSchema, { url: host, username: c.username, password: c.password }));
    }
    const push = await this.#push?.(organizationId, info);
    const spec = create(BuildSpecSchema, {
      ref: key,
      dockerfile: info.dockerfileContent,
      contextHashes: info.contextHashes,
      sourceRegistries,
      timeoutSeconds: Math.ceil(this.#timeoutMs / 1000),
      pushImage: push?.image ?? "",
      ...(push ? { pushAuth: create(RegistryAuthSchema, { url: parseImageRef(push.image).registry, username: push.credentials.username, password: push.credentials.password }) } : {}),
    });
    const target = await this.#targets(organizationId, run.where ?? {});
    if (!target.runtime.buildSnapshot) throw errors.failedPrecondition(`The runner ${target.runnerId} cannot run builds`);
    await run.onRunner?.(target.runnerId);
    emit(`building on runner ${target.runnerId}`);
    const contexts = this.#contexts;
    let sendError: unknown;
    // The contexts flow from the store into the call as the runner reads them (never held whole).
    async function* requests(): AsyncGenerator<BuildSnapshotRequest> {
      yield create(BuildSnapshotRequestSchema, { part: { case: "spec", value: spec } });
      try {
        for (const hash of info.contextHashes) {
          emit(`sending context ${hash}`);
          const body = await contexts.open(organizationId, hash, signal);
          yield create(BuildSnapshotRequestSchema, { part: { case: "contextHash", value: hash } });
          for await (const chunk of body as AsyncIterable<Uint8Array>) yield create(BuildSnapshotRequestSchema, { part: { case: "data", value: chunk } });
        }
      } catch (err) {
        sendError = err;
        throw err;
      }
    }
    let built: BuiltImage | undefined;
    try {
      for await (const event of target.runtime.buildSnapshot(requests(), signal)) {
        if (event.event.case === "log") for (const line of Buffer.from(event.event.value.data).toString().replace(/\n$/, "").split("\n")) emit(line);
        else if (event.event.case === "done") {
          const i = event.event.value;
          built = { digest: i.ref, size: Number(i.sizeBytes), entrypoint: i.entrypoint, cmd: i.cmd, runnerId: target.runnerId };
        }
      }
    } catch (err) {
      if (timeout.aborted && !run.signal?.aborted) throw new BuildFailed(`The build ran longer than ${this.#timeoutMs >= 60_000 ? `${Math.round(this.#timeoutMs / 60_000)} minutes` : `${Math.round(this.#timeoutMs / 1000)} seconds`} and was stopped`);
      throw sendError ?? err;
    }
    if (!built) throw errors.unavailable(`The runner ${target.runnerId} ended the build without its result`);
    await this.#held?.(target.runnerId, built.digest);
    return built;
  }
}
