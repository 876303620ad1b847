import { readdirSync } from "node:fs";
import { mkdir, readlink, symlink, unlink } from "node:fs/promises";
import * as path from "node:path";

/**
 * Uploads write to a temporary name beside their target (transfer.ts) and rename it on
 * completion; a failed one removes it. What an agent killed mid-upload leaves is found here: each
 * upload in flight is a symbolic link in the journal directory (in the agent's state dir, on the
 * sandbox's disk) pointing at its temporary file, made before the file and removed after the
 * rename. The next agent removes the files its predecessors' links point at. A journal rather
 * than a scan for leftovers: the directories uploads go to can be large, and any of them.
 */

/** The temporary name of an upload of `name`: hidden, beside it, never a name a user would pick. */
export const TEMP_NAME = /^\..*\.sandbar-upload-[0-9a-f]{16}$/s;

let journal: string | undefined;

/**
 * Uses `dir` as the journal from now on, and removes what uploads that were in flight when an
 * earlier agent died left behind. The journal is read at once (synchronously: no upload of this
 * agent can have begun, and the directory is usually missing or empty), the files are removed
 * in the background.
 */
export function openUploadJournal(dir: string): void {
  journal = dir;
  let stale: string[];
  try {
    stale = readdirSync(dir);
  } catch {
    return;
  }
  if (stale.length > 0) setImmediate(() => void sweep(dir, stale));
}

async function sweep(dir: string, names: string[]): Promise<void> {
  for (const name of names) {
    const entry = path.join(dir, name);
    try {
      const temp = await readlink(entry);
      // Only ever an upload's temporary file: the journal is writable by user code too.
      if (path.isAbsolute(temp) && TEMP_NAME.test(path.basename(temp))) await unlink(temp).catch(() => undefined);
    } catch {
      // Not a link: not ours.
    }
    await unlink(entry).catch(() => undefined);
  }
}

/**
 * Records an upload's temporary file before it is made; the entry to forget once it is renamed
 * or removed. Best effort (undefined when the journal cannot be written, e.g. on a full disk):
 * the upload goes on, and only a crash would leave its file behind.
 */
export async function recordUpload(id: string, temp: string): Promise<string | undefined> {
  if (journal === undefined) return undefined;
  const entry = path.join(journal, id);
  try {
    await symlink(temp, entry);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") return undefined;
    try {
      await mkdir(journal, { recursive: true, mode: 0o700 });
      await symlink(temp, entry);
    } catch {
      return undefined;
    }
  }
  return entry;
}

/** Drops an entry (in the background: a leftover entry whose file is gone costs the next agent a readlink). */
export function forgetUpload(entry: string | undefined): void {
  if (entry !== undefined) unlink(entry).catch(() => undefined);
}
