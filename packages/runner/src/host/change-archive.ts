import { readlink } from "node:fs/promises";
import path from "node:path";
import { Readable } from "node:stream";
import { Header, Pax } from "tar";
import { type LayerChange, openLayerFile } from "./changes.ts";

// A changeset as a tar stream, made entry by entry as the reader pulls (never whole in memory).
// Added and modified entries carry their current content; a deletion is an empty file named
// `.wh.<name>` beside it, the OCI image layer convention for whiteouts, so extracting the archive
// over a copy of the base (and applying the whiteouts) gives the sandbox's tree. Owners are not
// kept (every entry is 0:0); device files and sockets are left out.

const BLOCK = 512;
const CHUNK = 64 * 1024;

function header(fields: { path: string; type: "File" | "Directory" | "SymbolicLink"; mode: number; size: number; mtime: Date; linkpath?: string }): Buffer {
  const data = { ...fields, mode: fields.mode & 0o7777, uid: 0, gid: 0, uname: "", gname: "" };
  const h = new Header(data);
  const block = Buffer.alloc(BLOCK);
  // Long paths and link targets (or huge sizes) go in a PAX header before the entry.
  const needPax = h.encode(block, 0);
  return needPax ? Buffer.concat([new Pax({ path: data.path, linkpath: data.linkpath, size: data.size, mtime: data.mtime, uid: 0, gid: 0 }).encode(), block]) : block;
}

async function* entry(c: LayerChange): AsyncGenerator<Buffer> {
  const rel = c.path.slice(1);
  if (c.kind === "deleted") {
    yield header({ path: path.posix.join(path.posix.dirname(rel), `.wh.${path.posix.basename(rel)}`), type: "File", mode: 0o644, size: 0, mtime: c.mtime });
    return;
  }
  const source = c.upperPath!;
  if (c.type === "directory") {
    yield header({ path: `${rel}/`, type: "Directory", mode: c.mode, size: 0, mtime: c.mtime });
  } else if (c.type === "symlink") {
    const target = await readlink(source).catch(() => undefined);
    if (target !== undefined) yield header({ path: rel, type: "SymbolicLink", mode: c.mode, size: 0, mtime: c.mtime, linkpath: target });
  } else if (c.type === "file") {
    const fh = await openLayerFile(source);
    if (!fh) return; // vanished since the walk saw it
    try {
      const st = await fh.stat();
      // The size is fixed by the header: a file that shrinks meanwhile is padded, one that grows cut.
      const size = st.size;
      yield header({ path: rel, type: "File", mode: st.mode, size, mtime: st.mtime });
      let sent = 0;
      while (sent < size) {
        const buf = Buffer.alloc(Math.min(CHUNK, size - sent));
        const { bytesRead } = await fh.read(buf, 0, buf.length, sent);
        if (bytesRead === 0) {
          yield Buffer.alloc(size - sent);
          sent = size;
          break;
        }
        sent += bytesRead;
        yield bytesRead === buf.length ? buf : buf.subarray(0, bytesRead);
      }
      if (size % BLOCK !== 0) yield Buffer.alloc(BLOCK - (size % BLOCK));
    } finally {
      await fh.close();
    }
  }
}

async function* archive(changes: AsyncIterable<LayerChange>): AsyncGenerator<Buffer> {
  for await (const c of changes) yield* entry(c);
  yield Buffer.alloc(BLOCK * 2); // end of archive
}

/** The changes as a tar byte stream, pulled on demand. */
export function changesArchive(changes: AsyncIterable<LayerChange>): Readable {
  return Readable.from(archive(changes), { objectMode: false, highWaterMark: CHUNK });
}
