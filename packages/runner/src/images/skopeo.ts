import { spawn } from "node:child_process";
import { rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";

// Fetching through the OCI distribution API is skopeo's job (containers/image: manifest lists,
// basic and bearer-token auth from the WWW-Authenticate challenge, digest verification). It copies
// into an OCI image layout that we then unpack ourselves. Credentials go through an auth file of
// mode 0600, never through argv (visible in /proc) or the log.

export interface RegistryCredentials {
  username: string;
  password: string;
}

export interface CopyOptions {
  /** Registry host[:port] the credentials belong to (the key of the auth file). */
  registry: string;
  credentials?: RegistryCredentials;
  /** Plain HTTP / unverified TLS: only for loopback or registries configured as insecure. */
  insecure: boolean;
  /** Scratch directory for the auth file (inside the pull's temp dir). */
  scratch: string;
  signal?: AbortSignal;
  /** Called with skopeo's pid once it runs (tests kill it to simulate a crash). */
  onSpawn?: (pid: number) => void;
}

const SKOPEO = process.env.SANDBAR_SKOPEO ?? "skopeo";

/** `skopeo copy docker://<source> oci:<layout>:<name>` for linux/amd64. */
export async function skopeoCopy(source: string, layout: string, name: string, o: CopyOptions): Promise<void> {
  const authfile = path.join(o.scratch, "auth.json");
  const auths: Record<string, { auth: string }> = {};
  if (o.credentials) auths[o.registry] = { auth: Buffer.from(`${o.credentials.username}:${o.credentials.password}`).toString("base64") };
  // Always our own file: without one skopeo would read root's ~/.docker/config.json.
  await writeFile(authfile, JSON.stringify({ auths }), { mode: 0o600 });
  try {
    const args = ["copy", "--quiet", "--authfile", authfile, "--override-os", "linux", "--override-arch", "amd64", `--src-tls-verify=${!o.insecure}`, `docker://${source}`, `oci:${layout}:${name}`];
    await runSkopeo(args, source, o);
  } finally {
    await rm(authfile, { force: true });
  }
}

/**
 * `skopeo copy oci:<layout>:<name> docker://<dest>` with the manifest kept byte for byte
 * (--preserve-digests: the copy fails rather than change the digest the image is known by).
 */
export async function skopeoPush(layout: string, name: string, dest: string, o: CopyOptions): Promise<void> {
  const authfile = path.join(o.scratch, "push-auth.json");
  const auths: Record<string, { auth: string }> = {};
  if (o.credentials) auths[o.registry] = { auth: Buffer.from(`${o.credentials.username}:${o.credentials.password}`).toString("base64") };
  await writeFile(authfile, JSON.stringify({ auths }), { mode: 0o600 });
  try {
    const args = ["copy", "--quiet", "--preserve-digests", "--authfile", authfile, `--dest-tls-verify=${!o.insecure}`, `oci:${layout}:${name}`, `docker://${dest}`];
    await runSkopeo(args, dest, o);
  } finally {
    await rm(authfile, { force: true });
  }
}

function runSkopeo(args: string[], source: string, o: CopyOptions): Promise<void> {
  return new Promise((resolve, reject) => {
    if (o.signal?.aborted) return reject(errors.deadlineExceeded(`pull of ${source} was cancelled`));
    const child = spawn(SKOPEO, args, { stdio: ["ignore", "ignore", "pipe"], env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: o.scratch } });
    if (child.pid !== undefined) o.onSpawn?.(child.pid);
    let stderr = "";
    child.stderr.on("data", (c: Buffer) => (stderr = (stderr + c.toString()).slice(-8000)));
    const abort = () => child.kill("SIGKILL");
    o.signal?.addEventListener("abort", abort, { once: true });
    child.on("error", (err) => {
      o.signal?.removeEventListener("abort", abort);
      reject(errors.failedPrecondition(`cannot run skopeo (install Debian's skopeo package): ${err.message}`));
    });
    child.on("close", (code, signal) => {
      o.signal?.removeEventListener("abort", abort);
      if (code === 0) return resolve();
      if (o.signal?.aborted) return reject(errors.deadlineExceeded(`pull of ${source} was cancelled`));
      reject(classify(source, stderr, signal ?? code));
    });
  });
}

/** Turns skopeo's last words into one of our errors with a message a user can act on. */
export function classify(source: string, stderr: string, status: string | number | null): Error {
  const text = stderr.replace(/\s+/g, " ").trim();
  // The password must never come back in a message; skopeo does not print it, but be sure.
  const why = text.replace(/"auth"\s*:\s*"[^"]*"/g, '"auth":"***"').slice(-600);
  const lower = text.toLowerCase();
  // An HTTP status, not digits of a port or an address (a registry on port 38401 is no 401).
  const httpStatus = (code: number) => new RegExp(`(?<![\\d.:])${code}(?!\\d)`).test(lower);
  if (/unauthorized|authentication required|invalid username\/password|incorrect username or password/.test(lower) || httpStatus(401)) {
    return errors.permissionDenied(`registry refused the credentials for ${source}: check the registry's username and password (${why})`);
  }
  if (/denied|403 forbidden|requested access to the resource is denied/.test(lower)) {
    return errors.permissionDenied(`registry denied access to ${source} (${why})`);
  }
  if (/manifest unknown|name unknown|not found|no image found|does not exist/.test(lower) || httpStatus(404)) {
    return errors.notFound(`image ${source} not found in its registry (${why})`);
  }
  if (/choosing an image from manifest list|no image found in manifest list|matching the platform/.test(lower)) {
    return errors.failedPrecondition(`image ${source} has no linux/amd64 variant (${why})`);
  }
  if (/connection refused|no such host|i\/o timeout|dial tcp|server gave http response to https client|x509|tls/.test(lower)) {
    return errors.unavailable(`cannot reach the registry for ${source} (${why})`);
  }
  if (/digest|checksum|does not match/.test(lower)) {
    return errors.failedPrecondition(`image ${source} failed digest verification (${why})`);
  }
  if (status === "SIGKILL" || status === "SIGTERM") return errors.unavailable(`pull of ${source} was interrupted (skopeo ${status})`);
  return errors.failedPrecondition(`pull of ${source} failed (skopeo ${status}): ${why || "no message"}`);
}
