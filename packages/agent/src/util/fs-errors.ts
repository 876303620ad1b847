import { Code, ConnectError } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";

/**
 * A full file system (ENOSPC) or quota (EDQUOT) while writing p. gRPC's code stays
 * RESOURCE_EXHAUSTED (what the code means), but REST renders that code as 429, which clients take
 * for a rate limit and retry: the error asks control for 400 instead, the status the reference's
 * toolbox answers for a failed write.
 */
export function diskFull(p: string, quota = false): ConnectError {
  return new ConnectError(`${quota ? "disk quota exceeded" : "no space left on device"}: ${p}`, Code.ResourceExhausted, { "x-sandbar-http-status": "400" });
}

/** Whether a tool's message (git's, mkfifo's) says the disk or the quota is full. */
export function saysDiskFull(text: string): boolean {
  return /no space left on device|disk quota exceeded/i.test(text);
}

/** A Node file-system error as the ConnectError a caller should see, naming the path. */
export function fsError(err: unknown, p: string): ConnectError {
  if (err instanceof ConnectError) return err;
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  switch (code) {
    case "ENOENT":
      return errors.notFound(`no such file or directory: ${p}`);
    case "ENOTDIR":
      return errors.notFound(`a component of the path is not a directory: ${p}`);
    case "EACCES":
    case "EPERM":
      return errors.permissionDenied(`permission denied: ${p}`);
    case "EEXIST":
      return errors.alreadyExists(`already exists: ${p}`);
    case "EISDIR":
      return errors.failedPrecondition(`is a directory: ${p}`);
    case "ENOTEMPTY":
      return errors.failedPrecondition(`directory not empty: ${p}`);
    case "ENAMETOOLONG":
      return errors.invalidArgument(`path too long: ${p}`);
    case "ELOOP":
      return errors.invalidArgument(`too many levels of symbolic links: ${p}`);
    case "EROFS":
      return errors.failedPrecondition(`read-only file system: ${p}`);
    case "ENOSPC":
      return diskFull(p);
    case "EDQUOT":
      return diskFull(p, true);
    case "EBUSY":
      return errors.failedPrecondition(`resource busy: ${p}`);
    case "EXDEV":
      return errors.failedPrecondition(`cross-device operation: ${p}`);
    default:
      return errors.internal(`${(err as Error)?.message ?? String(err)}`);
  }
}

/** Runs an fs operation and rethrows its failure as a ConnectError about p. */
export async function fsCall<T>(p: string, op: () => Promise<T>): Promise<T> {
  try {
    return await op();
  } catch (err) {
    throw fsError(err, p);
  }
}
