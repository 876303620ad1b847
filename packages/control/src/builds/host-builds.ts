import { create } from "@bufbuild/protobuf";
import { errors } from "@sandbar/protocol";
import { type BuildSnapshotRequest, type BuildSpec, type LogChunk, type SnapshotProgress, SnapshotProgressSchema } from "@sandbar/protocol/gen/sandbar/runner/v1/runner_pb.js";
import { BuildFailed, type ImageStore, parseImageRef, type RegistryCredentials } from "@sandbar/runner/images";
import { snapshotInfo } from "@sandbar/runner/daemon";
import { BuildLog } from "../snapshots/pulls.ts";
import { unpackContext } from "./context-archive.ts";

// The building half of a declarative build, on the host whose image store builds it (a
// `sandbar runner`, or the control process's own runtime: the same code either way). The request
// stream is the spec, then each context's bytes as control reads them from object storage:
// nothing is fetched from here, so a runner needs no route to control's store, and the bytes
// flow with HTTP/2 back-pressure straight into tar. Credentials (FROM registries, the push
// target) serve this build only, through buildah's and skopeo's 0600 auth files: none is kept.
// Each build's log is kept by its ref while it runs and for the last few after (GetSnapshotLogs).

const KEEP = 100;
const REF = /^[a-zA-Z0-9_.-]{1,200}$/;

type Requests = AsyncIterator<BuildSnapshotRequest>;

function credentialsOf(what: string, a: { url: string; username: string; password: string }): RegistryCredentials {
  if (!a.username || !a.password) throw errors.invalidArgument(`${what}: username and password are both required`);
  return { username: a.username, password: a.password };
}

function checkSpec(spec: BuildSpec): void {
  if (!REF.test(spec.ref)) throw errors.invalidArgument("spec.ref must be a build key (letters, digits, '.', '_' or '-', at most 200)");
  if (!spec.dockerfile.trim()) throw errors.invalidArgument("spec.dockerfile must not be empty");
  if (spec.pushImage) parseImageRef(spec.pushImage);
  for (const a of spec.sourceRegistries) if (!a.url) throw errors.invalidArgument("spec.sourceRegistries: url (host[:port]) is required");
}

/** Reads each context's bytes off the request stream, in the spec's order, into `dir`. */
export async function readContexts(requests: Requests, hashes: string[], dir: string, signal: AbortSignal | undefined, onProgress: (line: string) => void): Promise<void> {
  let next = await requests.next();
  for (const hash of hashes) {
    if (next.done || next.value.part.case !== "contextHash" || next.value.part.value !== hash) throw errors.invalidArgument(`the bytes of context ${hash} were expected next`);
    let after: IteratorResult<BuildSnapshotRequest> | undefined;
    const bytes = async function* () {
      for (;;) {
        const r = await requests.next();
        if (r.done || r.value.part.case !== "data") return void (after = r);
        // A copy: the message's bytes may be a view of a receive buffer that is used again.
        yield Buffer.from(r.value.part.value);
      }
    };
    onProgress(`unpacking context ${hash}`);
    await unpackContext(hash, bytes(), dir, signal, onProgress);
    // tar may end at its end-of-archive blocks before the stream does: skip what is left of it.
    while (!after) {
      const r = await requests.next();
      if (r.done || r.value.part.case !== "data") after = r;
    }
    next = after;
  }
  if (!next.done) throw errors.invalidArgument("the build's request stream carries more than the spec's contexts");
}

export class HostBuilds {
  readonly #images: () => Promise<ImageStore>;
  readonly #logs = new Map<string, BuildLog>();

  constructor(images: () => Promise<ImageStore>) {
    this.#images = images;
  }

  /** BuildSnapshot: the build's output lines as it runs, then the image's info. */
  async *build(requests: AsyncIterable<BuildSnapshotRequest>, signal: AbortSignal): AsyncGenerator<SnapshotProgress> {
    const it = requests[Symbol.asyncIterator]();
    const first = await it.next();
    if (first.done || first.value.part.case !== "spec") throw errors.invalidArgument("a build's first message must be its spec");
    const spec = first.value.part.value;
    checkSpec(spec);
    const credentials: Record<string, RegistryCredentials> = {};
    for (const a of spec.sourceRegistries) credentials[a.url] = credentialsOf(`spec.sourceRegistries[${a.url}]`, a);
    const push = spec.pushImage ? { image: spec.pushImage, ...(spec.pushAuth ? { credentials: credentialsOf("spec.pushAuth", spec.pushAuth) } : {}) } : undefined;
    const store = await this.#images();
    const timeoutMs = spec.timeoutSeconds * 1000;
    const timeout = timeoutMs > 0 ? AbortSignal.timeout(timeoutMs) : undefined;
    const stop = timeout ? AbortSignal.any([signal, timeout]) : signal;

    // A second request for a build that runs here joins it (the store runs it once): same log.
    const running = this.#logs.get(spec.ref);
    const log = running && !running.done ? running : new BuildLog();
    if (log !== running) this.#remember(spec.ref, log);
    let readAll = false;
    const built = store
      .build(spec.ref, {
        dockerfile: spec.dockerfile,
        credentials,
        signal: stop,
        push,
        onProgress: (line) => log.push(line),
        context: async (dir, s) => {
          await readContexts(it, spec.contextHashes, dir, s, (line) => log.push(line));
          readAll = true;
        },
      })
      .then(
        (image) => (log.push(`image ${image.digest} ready (${image.size} bytes)`), image),
        (err: unknown) => {
          if (timeout?.aborted && !signal.aborted) throw errors.deadlineExceeded(`The build ran longer than ${spec.timeoutSeconds} seconds and was stopped`);
          // buildah's last lines say what failed: the caller records them.
          if (err instanceof BuildFailed) throw errors.failedPrecondition(err.message);
          throw err;
        },
      )
      .catch((err: unknown) => {
        log.push(`error: ${err instanceof Error ? err.message : String(err)}`);
        throw err;
      })
      .finally(() => {
        if (log !== running) log.end();
      });
    built.catch(() => undefined);
    if (log === running) {
      // Joined: its lines go to whoever started it; this caller hears the outcome.
      const image = await built;
      if (!readAll) for (let r = await it.next(); !r.done; r = await it.next());
      return yield create(SnapshotProgressSchema, { event: { case: "done", value: snapshotInfo(image) } });
    }
    for await (const chunk of log.follow(true, signal)) yield create(SnapshotProgressSchema, { event: { case: "log", value: chunk } });
    const image = await built;
    // A cached build never asked for its contexts: they are read to the end all the same.
    if (!readAll) for (let r = await it.next(); !r.done; r = await it.next());
    yield create(SnapshotProgressSchema, { event: { case: "done", value: snapshotInfo(image) } });
  }

  /** GetSnapshotLogs: a build's log by its ref, from its start; with `follow` until it ends. */
  async *logs(ref: string, follow: boolean, signal: AbortSignal): AsyncGenerator<LogChunk> {
    const log = this.#logs.get(ref);
    if (!log) throw errors.notFound(`No build ${ref} on this runner since it started`);
    for await (const chunk of log.follow(follow, signal)) yield { $typeName: "sandbar.runner.v1.LogChunk", data: chunk.data };
  }

  #remember(ref: string, log: BuildLog): void {
    this.#logs.delete(ref);
    this.#logs.set(ref, log);
    for (const [old, l] of this.#logs) {
      if (this.#logs.size <= KEEP) break;
      if (l.done) this.#logs.delete(old);
    }
  }
}
