import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { type Volume, VolumeSchema, type VolumeService, VolumeState } from "@sandbar/protocol/gen/sandbar/control/v1/volume_pb.js";
import { organizationOf } from "../call/call.ts";
import { Checks } from "../services/validate.ts";
import type { VolumeStorage } from "./storage.ts";
import { type VolumeRow, VolumeStore } from "./store.ts";

// VolumeService (spec 4.8). A volume is answered `pending_create` by the reference and made by a
// background job; here its storage is a directory, made before the create answers, so the
// answer is already `ready` (both states are recorded and sent as webhook events). Deletion is
// likewise carried through before the delete answers: pending_delete, deleting, deleted.

const STATES: Record<VolumeRow["state"], VolumeState> = {
  creating: VolumeState.CREATING,
  ready: VolumeState.READY,
  pending_create: VolumeState.PENDING_CREATE,
  pending_delete: VolumeState.PENDING_DELETE,
  deleting: VolumeState.DELETING,
  deleted: VolumeState.DELETED,
  error: VolumeState.ERROR,
};

function toVolume(r: VolumeRow): Volume {
  return create(VolumeSchema, {
    id: r.id,
    name: r.name,
    organizationId: r.organizationId,
    state: STATES[r.state],
    createdAt: timestampFromDate(r.createdAt),
    updatedAt: timestampFromDate(r.updatedAt),
    lastUsedAt: r.lastUsedAt ? timestampFromDate(r.lastUsedAt) : undefined,
    errorReason: r.errorReason ?? undefined,
  });
}

export function volumeService(orm: MikroORM, storage: VolumeStorage, log: (line: string) => void = () => {}): Partial<ServiceImpl<typeof VolumeService>> {
  const store = new VolumeStore(orm);

  /** pending_create → creating → ready (or error, with the reason). */
  async function provision(row: VolumeRow): Promise<VolumeRow> {
    await store.transition(row.id, "creating", { from: ["pending_create"] });
    try {
      await storage.create(row.id);
    } catch (err) {
      log(`volume ${row.id}: create failed: ${(err as Error).message}`);
      return (await store.transition(row.id, "error", { errorReason: "Volume storage could not be created. You may delete the volume and create it again." }))!;
    }
    return (await store.transition(row.id, "ready", { from: ["creating"], errorReason: null })) ?? row;
  }

  /** pending_delete → deleting → deleted, renamed `<name>-deleted` (or error, with the reason). */
  async function remove(row: VolumeRow): Promise<void> {
    await store.transition(row.id, "deleting", { from: ["pending_delete"] });
    try {
      await storage.remove(row.id);
    } catch (err) {
      log(`volume ${row.id}: delete failed: ${(err as Error).message}`);
      await store.transition(row.id, "error", { errorReason: "Volume deletion failed. You may retry deletion." });
      return;
    }
    await store.transition(row.id, "deleted", { from: ["deleting"], rename: `${row.name}-deleted` });
  }

  // A process that stopped between the steps above left volumes half way: carried on at start.
  // Transitions name the state they leave (a step already taken is skipped) and storage calls
  // are idempotent, so a second process doing the same is harmless.
  void store
    .unfinished()
    .then(async (rows) => {
      for (const row of rows) await (row.state === "pending_create" || row.state === "creating" ? provision(row) : remove(row));
    })
    .catch((err: unknown) => log(`volumes: resuming unfinished work failed: ${(err as Error).message}`));

  return {
    async listVolumes(req, ctx) {
      return { items: (await store.list(organizationOf(ctx), req.includeDeleted ?? false)).map(toVolume) };
    },

    async createVolume(req, ctx) {
      const organizationId = organizationOf(ctx);
      const id = randomUUID();
      const name = req.name === "" ? id : req.name;
      new Checks().displayName("name", name).that(!name.endsWith("-deleted"), "name must not end with '-deleted'").done();
      return toVolume(await provision(await store.insert(id, organizationId, name)));
    },

    async getVolume(req, ctx) {
      return toVolume(await store.get(organizationOf(ctx), req.volumeId));
    },

    async getVolumeByName(req, ctx) {
      return toVolume(await store.byName(organizationOf(ctx), req.name));
    },

    async deleteVolume(req, ctx) {
      await remove(await store.markForDeletion(organizationOf(ctx), req.volumeId));
      return {};
    },
  };
}
