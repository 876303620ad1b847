import { errors } from "@sandbar/protocol";
import type { SandboxRecord } from "../db/entities.ts";
import type { OperationContext } from "./operation-context.ts";

// A sandbox's lineage (0.218 getSandboxForks / getSandboxParent / getSandboxAncestors): the
// `parentId` each fork records. A parent that was deleted ends the line (its forks stand on their
// own layers, which stay while they are used).

/** Ancestors looked up at most: a line longer than this is answered cut. */
const MAX_ANCESTORS = 100;

export async function forksOf(c: OperationContext, organizationId: string, idOrName: string, includeDestroyed = false): Promise<SandboxRecord[]> {
  const row = await c.store.find(organizationId, idOrName);
  return c.store.forksOf(organizationId, row.id, includeDestroyed);
}

export async function parentOf(c: OperationContext, organizationId: string, idOrName: string): Promise<SandboxRecord> {
  const row = await c.store.find(organizationId, idOrName);
  const parent = await visibleParent(c, row);
  if (!parent) throw errors.notFound(`Sandbox ${row.id} has no parent`);
  return parent;
}

export async function ancestorsOf(c: OperationContext, organizationId: string, idOrName: string): Promise<SandboxRecord[]> {
  const out: SandboxRecord[] = [];
  for (let row: SandboxRecord | undefined = await c.store.find(organizationId, idOrName); row && out.length < MAX_ANCESTORS; ) {
    row = await visibleParent(c, row);
    if (row) out.push(row);
  }
  return out;
}

async function visibleParent(c: OperationContext, row: SandboxRecord): Promise<SandboxRecord | undefined> {
  if (!row.parentId) return undefined;
  const parent = await c.store.byId(row.parentId);
  if (!parent || parent.organizationId !== row.organizationId || parent.state === "destroyed") return undefined;
  return parent;
}
