import { readdir } from "node:fs/promises";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import { type RunnerSnapshotService, type SnapshotInfo, SnapshotInfoSchema, type SnapshotProgress, SnapshotProgressSchema } from "@sandbar/protocol/gen/sandbar/runner/v1/runner_pb.js";
import type { Image } from "@sandbar/runner/images";
import type { SandboxRuntime } from "../runtime.ts";

// RunnerSnapshotService over the runner's image store: control asks a runner to hold the image a
// sandbox boots from before it creates the sandbox there. A snapshot's ref on a runner is the
// image's manifest digest (what control records as the snapshot's ref), so "is it here" is one
// lookup and a pull can be checked against it. Registry credentials come with each pull and are
// handed to skopeo for that pull only (a 0600 auth file it removes): the runner keeps none.
// Removal is refused while a sandbox on this host boots from the image. Builds are the runtime's
// (builds/host-builds.ts): control calls the same method on its in-process runtime.

const DIGEST = /^sha256:[a-f0-9]{64}$/;

export function snapshotInfo(image: Image): SnapshotInfo {
  return create(SnapshotInfoSchema, {
    ref: image.digest,
    sizeBytes: BigInt(image.size),
    entrypoint: image.config.entrypoint,
    cmd: image.config.cmd,
    digest: image.digest.slice("sha256:".length),
    workdir: image.config.workdir ?? "",
    user: image.config.user ?? "",
    env: image.config.env,
  });
}

function digestOf(ref: string): string {
  if (!ref) throw errors.invalidArgument("ref is required");
  if (!DIGEST.test(ref)) throw errors.invalidArgument("ref must be an image manifest digest (sha256:<64 hex>)");
  return ref;
}

export function runnerSnapshotServiceImpl(runtime: SandboxRuntime): Partial<ServiceImpl<typeof RunnerSnapshotService>> {
  const images = async () => {
    if (!runtime.images) throw errors.failedPrecondition("This runner's provider has no image store");
    return runtime.images();
  };
  return {
    async *pullSnapshot(req, ctx): AsyncGenerator<SnapshotProgress> {
      const ref = digestOf(req.ref);
      if (!req.image) throw errors.invalidArgument("image is required");
      const store = await images();
      const held = await store.get(ref);
      if (held) return yield create(SnapshotProgressSchema, { event: { case: "done", value: snapshotInfo(held) } });
      if (req.auth && (!req.auth.username || !req.auth.password)) throw errors.invalidArgument("auth: username and password are both required");
      const credentials = req.auth ? { username: req.auth.username, password: req.auth.password } : undefined;
      // Progress lines are streamed as the pull makes them (a queue between its callback and this stream).
      const lines: string[] = [];
      let wake: (() => void) | undefined;
      let finished = false;
      const pull = store.pull(req.image, { credentials, signal: ctx.signal, onProgress: (line) => (lines.push(line), wake?.()) }).finally(() => ((finished = true), wake?.()));
      pull.catch(() => undefined);
      for (;;) {
        while (lines.length) yield create(SnapshotProgressSchema, { event: { case: "log", value: { data: Buffer.from(`${lines.shift()}\n`) } } });
        if (finished) break;
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
      }
      const image = await pull;
      if (image.digest !== ref) throw errors.failedPrecondition(`${req.image} is ${image.digest} on its registry, not ${ref}`);
      yield create(SnapshotProgressSchema, { event: { case: "done", value: snapshotInfo(image) } });
    },
    async *buildSnapshot(requests, ctx) {
      if (!runtime.buildSnapshot) throw errors.failedPrecondition("This runner's provider cannot build images");
      yield* runtime.buildSnapshot(requests, ctx.signal);
    },
    async *getSnapshotLogs(req, ctx) {
      if (!runtime.snapshotLogs) throw errors.notFound(`No build ${req.ref} on this runner`);
      yield* runtime.snapshotLogs(req.ref, req.follow, ctx.signal);
    },
    async getSnapshotInfo(req) {
      const image = await (await images()).get(digestOf(req.ref));
      if (!image) throw errors.notFound(`No snapshot ${req.ref} on this runner`);
      return snapshotInfo(image);
    },
    async listSnapshots() {
      const store = await images();
      const names = await readdir(path.join(store.root, "images")).catch(() => [] as string[]);
      const held: SnapshotInfo[] = [];
      for (const name of names) {
        // A pull publishes images/sha256-<hex>/ whole (a rename), with image.json in it.
        const image = name.startsWith("sha256-") ? await store.get(`sha256:${name.slice("sha256-".length)}`) : undefined;
        if (image) held.push(snapshotInfo(image));
      }
      return { snapshots: held };
    },
    async removeSnapshot(req) {
      const store = await images();
      const image = await store.get(digestOf(req.ref));
      if (!image) return {};
      const users = (await runtime.list()).filter((s) => s.rootfs === image.rootfs).map((s) => s.id);
      if (users.length) throw errors.failedPrecondition(`Snapshot ${req.ref} is in use by sandbox ${users.join(", ")} on this runner`);
      await store.remove(image.digest);
      return {};
    },
  };
}
