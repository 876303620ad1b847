import { readdir, readFile, rename, writeFile } from "node:fs/promises";
import type { SandboxSpec } from "../provider.ts";
import { isErrno } from "./files.ts";
import type { Layout } from "./layout.ts";

// The sandbox's record on disk: what it was created with and what it should be doing. Together
// with the cgroup (are processes running?) it is the whole state, so a restarted runner picks
// up where the last one left off.

export interface SandboxRecord {
  version: 1;
  spec: SandboxSpec;
  hostUid: number;
  createdAt: string;
  desired: "created" | "started" | "stopped";
  startedAt?: string;
  /** How the first process ended, when this runner saw it end. */
  lastExit?: { code: number | null; signal: string | null; at: string };
}

export async function readRecord(layout: Layout, id: string): Promise<SandboxRecord | undefined> {
  let text: string;
  try {
    text = await readFile(layout.stateFile(id), "utf8");
  } catch (err) {
    if (isErrno(err, "ENOENT") || isErrno(err, "ENOTDIR")) return undefined;
    throw err;
  }
  const rec = JSON.parse(text) as SandboxRecord;
  if (rec.version !== 1) throw new Error(`sandbox ${id}: unknown record version ${String(rec.version)}`);
  return rec;
}

/** Atomic replace (write + rename): a crash leaves the old or the new record, never half. */
export async function writeRecord(layout: Layout, rec: SandboxRecord): Promise<void> {
  const file = layout.stateFile(rec.spec.id);
  const tmp = `${file}.tmp-${process.pid}`;
  await writeFile(tmp, JSON.stringify(rec, null, 2), { mode: 0o600 });
  await rename(tmp, file);
}

export async function listRecordIds(layout: Layout): Promise<string[]> {
  try {
    return (await readdir(layout.sandboxesDir, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name);
  } catch (err) {
    if (isErrno(err, "ENOENT")) return [];
    throw err;
  }
}

/** Every readable record of the layout; one that cannot be read is logged and skipped. */
export async function readAllRecords(layout: Layout, log: (line: string) => void): Promise<SandboxRecord[]> {
  const out: SandboxRecord[] = [];
  for (const id of await listRecordIds(layout)) {
    try {
      const rec = await readRecord(layout, id);
      if (rec) out.push(rec);
    } catch (err) {
      log(`sandbox ${id}: unreadable record skipped: ${String(err)}`);
    }
  }
  return out;
}
