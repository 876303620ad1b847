import { once } from "node:events";
import type { Readable } from "node:stream";
import { errors } from "@sandbar/protocol";
import * as tar from "tar";

// A build context as the clients make it (a tar archive of files, directories and links),
// unpacked into the build dir on the host that builds: node-tar strips absolute paths and "..",
// never writes through a symlink; owners are not kept, and device nodes, fifos and the like are
// skipped (and said so).

const ENTRY_TYPES = new Set(["File", "OldFile", "ContiguousFile", "Directory", "SymbolicLink", "Link"]);

export async function unpackContext(hash: string, body: Readable | AsyncIterable<Uint8Array>, dir: string, signal: AbortSignal | undefined, onProgress?: (line: string) => void): Promise<void> {
  const refused: string[] = [];
  const filter = (p: string, e: unknown) => ((e && typeof e === "object" && "type" in e && ENTRY_TYPES.has(String(e.type))) || !(e && typeof e === "object" && "type" in e) ? true : (refused.push(p), false));
  const unpack = tar.x({ cwd: dir, strict: true, preserveOwner: false, filter });
  // Not stream.pipeline: node-tar finishes at the archive's end-of-archive blocks, which can come
  // before its source ends (the next context is still being fetched), and a pipeline that asks
  // for its end after that waits forever. Its end is awaited from before the first byte.
  const done = new Promise<void>((resolve, reject) => {
    unpack.once("finish", () => resolve());
    unpack.on("error", reject);
  });
  done.catch(() => undefined);
  try {
    for await (const chunk of body) {
      signal?.throwIfAborted();
      if (!unpack.write(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength))) await Promise.race([once(unpack, "drain"), done]);
    }
    signal?.throwIfAborted();
    unpack.end();
    await done;
  } catch (err) {
    if (signal?.aborted) throw errors.deadlineExceeded("build was cancelled");
    throw errors.failedPrecondition(`Build context ${hash} is not a readable tar archive: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (refused.length) onProgress?.(`context ${hash}: skipped ${refused.length} entries that are not files, directories or links`);
}
