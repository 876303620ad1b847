import { createHash } from "node:crypto";
import { statfs } from "node:fs/promises";
import { cpus, loadavg, totalmem, freemem } from "node:os";
import { Readable } from "node:stream";
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import {
  type ArchiveTrailer,
  Compression,
  type PackSandboxResponse,
  type RestoreSandboxRequest,
  type SandboxChangesPart,
  RunnerInfoSchema,
  RunnerService,
  SandboxState,
  type SandboxStatus,
  SandboxStatusSchema,
} from "@sandbar/protocol/gen/sandbar/runner/v1/runner_pb.js";
import type { SandboxRuntime } from "../runtime.ts";
import { SandboxQueue } from "./sandbox-queue.ts";
import { changesPartToProto, networkFromProto, resourcesFromProto, specFromProto, statusToProto } from "./convert.ts";

// RunnerService over a SandboxRuntime: what a `sandbar runner` process serves around the same
// LocalRuntime a single-host server uses in-process. Every call is idempotent by sandbox id, as
// the protocol says, because the runtime's are.

export interface RunnerServiceOptions {
  runtime: SandboxRuntime;
  /** Where sandboxes live (its file system's size and use are the disk figures). */
  dataDir: string;
  version: string;
  /** What the runner offers sandboxes; unset figures are the host's. */
  capacity?: { cpu?: number; memoryGiB?: number; diskGiB?: number; gpu?: number; gpuType?: string };
  /** Whether it mounts volumes from a root shared with control and the region's other runners. */
  sharedVolumes?: boolean;
}

export function runnerServiceImpl({ runtime, dataDir, version, capacity = {}, sharedVolumes = false }: RunnerServiceOptions): Partial<ServiceImpl<typeof RunnerService>> {
  const status = async (id: string): Promise<SandboxStatus> => {
    const s = await runtime.inspect(id);
    if (!s) throw errors.notFound(`No sandbox ${id} on this runner`);
    return statusToProto(s);
  };
  // What a create or start that returned knows: the sandbox runs. A full status (usage, the agent's
  // process found among the sandbox's) costs 3-9 ms on the critical path of time to interactive,
  // and the caller reads none of it; InspectSandbox answers it.
  const started = (id: string): SandboxStatus => create(SandboxStatusSchema, { id, state: SandboxState.STARTED });
  const id = (raw: string): string => {
    if (!raw) throw errors.invalidArgument("id is required");
    return raw;
  };
  const queue = new SandboxQueue();
  return {
    async createSandbox(req) {
      // The runtime creates and starts in one step; a create that must stay stopped is not one of its operations.
      if (req.skipStart) throw errors.invalidArgument("skip_start: this runner creates sandboxes started; stop it after the create");
      const spec = specFromProto(req.spec);
      await queue.run(spec.id, () => runtime.create(spec));
      return started(spec.id);
    },
    async startSandbox(req) {
      await queue.run(id(req.id), () => runtime.start(req.id));
      return started(req.id);
    },
    async stopSandbox(req) {
      await queue.run(id(req.id), () => runtime.stop(req.id, { force: req.force }));
      return status(req.id);
    },
    async pauseSandbox(req) {
      await queue.run(id(req.id), () => runtime.pause(req.id));
      return status(req.id);
    },
    async resumeSandbox(req) {
      await queue.run(id(req.id), () => runtime.resume(req.id));
      return status(req.id);
    },
    async destroySandbox(req) {
      await queue.run(id(req.id), () => runtime.destroy(req.id));
      return create(SandboxStatusSchema, { id: req.id, state: SandboxState.DESTROYED });
    },
    inspectSandbox: (req) => status(id(req.id)),
    async listSandboxes(req) {
      const all = (await runtime.list()).map(statusToProto);
      return { sandboxes: req.states.length ? all.filter((s) => req.states.includes(s.state)) : all };
    },
    async setSandboxEnv(req) {
      await runtime.setEnv(id(req.id), { ...req.env });
      return status(req.id);
    },
    async setSandboxNetwork(req) {
      await runtime.setNetwork(id(req.id), networkFromProto(req.network));
      return status(req.id);
    },
    async resizeSandbox(req) {
      await queue.run(id(req.id), () => runtime.resize(req.id, resourcesFromProto(req.resources)));
      return status(req.id);
    },
    async captureLayer(req) {
      await queue.run(id(req.id), () => runtime.captureLayer(req.id, req.layerId));
      return {};
    },
    async squashLayers(req) {
      await runtime.squashLayers(req.layerIds, req.layerId);
      return {};
    },
    async removeLayers(req) {
      await runtime.removeLayers(req.layerIds);
      return {};
    },
    async listLayers() {
      return { layers: (await runtime.listLayers()).map((l) => ({ id: l.id, createdAt: timestampFromDate(l.createdAt) })) };
    },
    async exportLayers(req) {
      if (!runtime.exportLayers) throw errors.unimplemented("this runner does not export layers");
      if (!req.destination) throw errors.invalidArgument("destination is required");
      const credentials = req.auth ? { username: req.auth.username, password: req.auth.password } : undefined;
      const out = await runtime.exportLayers({ layers: req.layerIds, ...(req.image ? { image: req.image } : {}), user: req.user, push: { image: req.destination, ...(credentials ? { credentials } : {}) } });
      return { digest: out.digest, layers: out.layers, bytes: BigInt(out.bytes) };
    },
    async getAgentAccess(req) {
      const dial = await runtime.connectAgent(id(req.id));
      return { secret: dial.secret, key: dial.key };
    },
    async *packSandbox(req): AsyncGenerator<PackSandboxResponse> {
      if (req.compression !== Compression.UNSPECIFIED && req.compression !== Compression.NONE) {
        throw errors.invalidArgument("compression: this runner packs uncompressed tar only");
      }
      const tar = await runtime.pack(id(req.id));
      yield { $typeName: "sandbar.runner.v1.PackSandboxResponse", part: { case: "header", value: { $typeName: "sandbar.runner.v1.ArchiveHeader", compression: Compression.NONE, snapshotRef: "", estimatedSizeBytes: 0n } } };
      const hash = createHash("sha256");
      let size = 0n;
      for await (const chunk of tar as AsyncIterable<Buffer>) {
        hash.update(chunk);
        size += BigInt(chunk.length);
        yield { $typeName: "sandbar.runner.v1.PackSandboxResponse", part: { case: "data", value: chunk } };
      }
      yield { $typeName: "sandbar.runner.v1.PackSandboxResponse", part: { case: "trailer", value: { $typeName: "sandbar.runner.v1.ArchiveTrailer", sizeBytes: size, sha256: hash.digest("hex") } } };
    },
    async *getSandboxChanges(req): AsyncGenerator<SandboxChangesPart> {
      if (!runtime.changes) throw errors.unimplemented("this runner does not read changesets");
      const format = req.format || "list";
      if (format !== "list" && format !== "tar" && format !== "diff") throw errors.invalidArgument(`format: must be one of list, tar, diff (got ${JSON.stringify(format)})`);
      for await (const part of runtime.changes(id(req.id), { format, prefix: req.pathPrefix || undefined, after: req.after || undefined, consistent: req.consistent, since: req.since.length ? req.since : undefined })) yield changesPartToProto(part);
    },
    async restoreSandbox(requests) {
      const it = requests[Symbol.asyncIterator]();
      const first = await it.next();
      if (first.done || first.value.part.case !== "header") throw errors.invalidArgument("restore: the first message must be the header");
      const header = first.value.part.value;
      if (header.archive && header.archive.compression !== Compression.UNSPECIFIED && header.archive.compression !== Compression.NONE) {
        throw errors.invalidArgument("archive.compression: this runner restores uncompressed tar only");
      }
      const spec = specFromProto(header.spec);
      await queue.run(spec.id, async () => {
        await runtime.restore(spec, Readable.from(checkedData(it), { objectMode: false }));
        if (header.start) await runtime.start(spec.id);
      });
      return status(spec.id);
    },
    async getRunnerInfo() {
      const all = await runtime.list();
      const disk = await statfs(dataDir);
      const ready = await runtime.assertReady().then(
        () => ({ healthy: true, reason: "" }),
        (err: unknown) => ({ healthy: false, reason: err instanceof Error ? err.message : String(err) }),
      );
      const diskTotal = Number(disk.blocks) * Number(disk.bsize);
      const diskFree = Number(disk.bavail) * Number(disk.bsize);
      return create(RunnerInfoSchema, {
        id: runtime.runnerId,
        version,
        provider: "linux",
        capacity: {
          cpuMillicores: (capacity.cpu ?? cpus().length) * 1000,
          memoryMib: capacity.memoryGiB !== undefined ? capacity.memoryGiB * 1024 : Math.floor(totalmem() / 2 ** 20),
          diskMib: capacity.diskGiB !== undefined ? capacity.diskGiB * 1024 : Math.floor(diskTotal / 2 ** 20),
          gpu: capacity.gpu ?? 0,
        },
        gpuType: capacity.gpu ? (capacity.gpuType ?? "") : "",
        usage: {
          cpuPercent: Math.min(100, (loadavg()[0]! / cpus().length) * 100),
          memoryPercent: ((totalmem() - freemem()) / totalmem()) * 100,
          diskPercent: diskTotal ? ((diskTotal - diskFree) / diskTotal) * 100 : 0,
          loadAverage: loadavg()[2]! / cpus().length,
        },
        sandboxCount: all.length,
        startedSandboxCount: all.filter((s) => s.state === "started").length,
        services: [{ name: "linux", ...ready }],
        sharedVolumes,
      });
    },
  };
}

/** The data parts of a restore stream, refused at the end unless the trailer matches them. */
async function* checkedData(it: AsyncIterator<RestoreSandboxRequest>): AsyncGenerator<Buffer> {
  const hash = createHash("sha256");
  let size = 0n;
  let trailer: ArchiveTrailer | undefined;
  for (let r = await it.next(); !r.done; r = await it.next()) {
    const part = r.value.part;
    if (trailer) throw errors.invalidArgument("restore: nothing may follow the trailer");
    if (part.case === "data") {
      hash.update(part.value);
      size += BigInt(part.value.length);
      yield Buffer.from(part.value.buffer, part.value.byteOffset, part.value.byteLength);
    } else if (part.case === "trailer") trailer = part.value;
    else throw errors.invalidArgument("restore: only data and a trailer may follow the header");
  }
  if (!trailer) throw errors.invalidArgument("restore: the archive ended without its trailer");
  if (trailer.sizeBytes !== size || trailer.sha256 !== hash.digest("hex")) {
    throw errors.invalidArgument(`restore: the archive does not match its trailer (${size} bytes received, ${trailer.sizeBytes} announced)`);
  }
}
