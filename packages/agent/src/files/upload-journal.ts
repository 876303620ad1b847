import { randomBytes } from "node:crypto";
import { readdirSync } from "node:fs";
import { mkdir, readdir, readlink, symlink, unlink } from "node:fs/promises";
import * as path from "node:path";

/**
 * Uploads write to a temporary name beside their target (transfer.ts) and rename it on
 * completion; a failed one removes it. What an agent killed mid-upload leaves is found through
 * this journal: the first upload into a directory in an agent's life records the directory (a
 * symbolic link in the journal directory, in the agent's state dir on the sandbox's disk), and
 * the next agent looks for temporary names in the directories its predecessors recorded, then
 * drops their records. Only those directories are read (the home directory can be large, and
 * uploads may go anywhere), and an upload costs no journal write but the first into a directory.
 */

/** The temporary name of an upload of `name`: hidden, beside it, never a name a user would pick. */
const TEMP_NAME = /^\..*\.sandbar-upload-[0-9a-f]{16}$/s;

let journal: string | undefined;
/** This agent's records start with it: the sweep of its predecessors' records never takes them. */
const run = randomBytes(6).toString("hex");
/** Directories this agent recorded (or is recording). */
const recorded = new Map<string, Promise<void>>();
/** This agent's temporary files that exist or are being made: the sweep leaves them alone. */
const inFlight = new Set<string>();

/**
 * Uses `dir` as the journal from now on, and removes what uploads that were in flight when an
 * earlier agent died left behind. The journal is listed at once (synchronously: the directory is
 * usually small or missing), the directories it names are read in the background.
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

async function sweep(journalDir: string, entries: string[]): Promise<void> {
  const done = new Set<string>();
  for (const name of entries) {
    const entry = path.join(journalDir, name);
    const dir = await readlink(entry).catch(() => undefined);
    if (dir !== undefined && path.isAbsolute(dir) && !done.has(dir)) {
      done.add(dir);
      for (const file of await readdir(dir).catch(() => [] as string[])) {
        const temp = path.join(dir, file);
        if (TEMP_NAME.test(file) && !inFlight.has(temp)) await unlink(temp).catch(() => undefined);
      }
    }
    await unlink(entry).catch(() => undefined);
  }
}

/**
 * Notes that `temp` (an upload's temporary file, about to be made) exists until uploadEnded; the
 * first in its directory records the directory, best effort (a full disk may refuse the record:
 * then only a crash would leave the file behind). Resolves once the record is written.
 */
export function uploadStarted(temp: string): Promise<void> {
  inFlight.add(temp);
  const dir = path.dirname(temp);
  let done = recorded.get(dir);
  if (!done) {
    done = record(dir);
    recorded.set(dir, done);
  }
  return done;
}

/** The temporary file is renamed or removed. */
export function uploadEnded(temp: string): void {
  inFlight.delete(temp);
}

async function record(dir: string): Promise<void> {
  if (journal === undefined) return;
  const entry = path.join(journal, `${run}-${randomBytes(6).toString("hex")}`);
  try {
    await symlink(dir, entry);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") return void recorded.delete(dir);
    try {
      await mkdir(journal, { recursive: true, mode: 0o700 });
      await symlink(dir, entry);
    } catch {
      recorded.delete(dir); // tried again with the next upload there
    }
  }
}
