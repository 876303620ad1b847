import { pipeline } from "node:stream/promises";
import { errors } from "@sandbar/protocol";
import { BuildFailed, fromRegistries, type Image, type ImageStore, type RegistryCredentials } from "@sandbar/runner/images";
import * as tar from "tar";
import type { BuildContexts } from "../object-storage/index.ts";
import type { CredentialsFor } from "../snapshots/pulls.ts";
import { type BuildInfoRecord, refHex } from "./build-info.ts";

// Runs a declarative build on this host: the organization's contexts fetched from object storage
// by hash into the build dir, the FROM registries' credentials from the organization's registries,
// then the image store's buildah build. Keyed by organization and build ref: the same build of
// one organization runs once and is reused after; another organization builds its own (its
// contexts must be in its own prefix, its FROM images readable with its own credentials).

export interface BuildRun {
  signal?: AbortSignal;
  onProgress?: (line: string) => void;
}

// Context archives as the clients make them: files, directories and links only.
const ENTRY_TYPES = new Set(["File", "OldFile", "ContiguousFile", "Directory", "SymbolicLink", "Link"]);

export class Builder {
  readonly #images: () => Promise<ImageStore>;
  readonly #contexts: BuildContexts;
  readonly #credentialsFor: CredentialsFor;
  readonly #mirror: string | undefined;
  readonly #timeoutMs: number;

  /** `timeoutMs`: a build running longer is stopped (the reference's BUILD_TIMEOUT_MIN: 120 minutes). */
  constructor(o: { images: () => Promise<ImageStore>; contexts: BuildContexts; credentialsFor: CredentialsFor; mirror?: string; timeoutMs?: number }) {
    this.#timeoutMs = o.timeoutMs ?? 120 * 60_000;
    this.#images = o.images;
    this.#contexts = o.contexts;
    this.#credentialsFor = o.credentialsFor;
    this.#mirror = o.mirror;
  }

  static key(organizationId: string, info: BuildInfoRecord): string {
    return `${organizationId}-${refHex(info.snapshotRef)}`;
  }

  /** The image of an earlier identical build, if still on this host. */
  async cached(organizationId: string, info: BuildInfoRecord): Promise<Image | undefined> {
    return (await this.#images()).built(Builder.key(organizationId, info));
  }

  async build(organizationId: string, info: BuildInfoRecord, run: BuildRun = {}): Promise<Image> {
    const credentials: Record<string, RegistryCredentials> = {};
    for (const host of fromRegistries(info.dockerfileContent, this.#mirror)) {
      const c = await this.#credentialsFor(organizationId, host);
      if (c) credentials[host] = c;
    }
    const timeout = AbortSignal.timeout(this.#timeoutMs);
    const signal = run.signal ? AbortSignal.any([run.signal, timeout]) : timeout;
    return (await this.#images()).build(Builder.key(organizationId, info), {
      dockerfile: info.dockerfileContent,
      credentials,
      signal,
      onProgress: run.onProgress,
      context: async (dir, signal) => {
        for (const hash of info.contextHashes) {
          run.onProgress?.(`fetching context ${hash}`);
          const body = await this.#contexts.open(organizationId, hash, signal);
          const refused: string[] = [];
          // node-tar strips absolute paths and "..", and never writes through a symlink; owners
          // are not kept, and device nodes, fifos and the like are skipped.
          await pipeline(body, tar.x({ cwd: dir, strict: true, preserveOwner: false, filter: (p, e) => (("type" in e && ENTRY_TYPES.has(e.type)) || !("type" in e) ? true : (refused.push(p), false)) }), { signal }).catch((err: unknown) => {
            throw errors.failedPrecondition(`Build context ${hash} is not a readable tar archive: ${err instanceof Error ? err.message : String(err)}`);
          });
          if (refused.length) run.onProgress?.(`context ${hash}: skipped ${refused.length} entries that are not files, directories or links`);
        }
      },
    }).catch((err: unknown) => {
      if (timeout.aborted && !run.signal?.aborted) throw new BuildFailed(`The build ran longer than ${this.#timeoutMs >= 60_000 ? `${Math.round(this.#timeoutMs / 60_000)} minutes` : `${Math.round(this.#timeoutMs / 1000)} seconds`} and was stopped`);
      throw err;
    });
  }
}
