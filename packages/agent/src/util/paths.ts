import * as path from "node:path";
import { errors } from "@sandbar/protocol";

/** A caller's path, absolute or relative to the work dir. Empty is refused unless a fallback is given. */
export function resolvePath(workDir: string, p: string, what = "path", fallback?: string): string {
  if (p === "") {
    if (fallback !== undefined) return path.resolve(workDir, fallback);
    throw errors.invalidArgument(`${what} is required`);
  }
  if (p.includes("\0")) throw errors.invalidArgument(`${what} contains a NUL byte`);
  return path.resolve(workDir, p);
}

/** A file:// URI (or a plain path) as a path. */
export function uriToPath(workDir: string, uri: string): string {
  if (uri.startsWith("file://")) {
    let rest = uri.slice("file://".length);
    try {
      rest = decodeURIComponent(rest);
    } catch {
      throw errors.invalidArgument(`uri is not a valid file URI: ${uri}`);
    }
    return resolvePath(workDir, rest, "uri");
  }
  return resolvePath(workDir, uri, "uri");
}
