import { spawn } from "node:child_process";
import { writeFile } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import { DOCKER_HUB, isLoopbackRegistry, parseImageRef } from "./ref.ts";
import type { RegistryCredentials } from "./skopeo.ts";

// Declarative builds run by Debian's buildah as root: vfs storage under the image store (no
// overlay-on-overlay, no fuse), chroot isolation, no network for RUN steps (only loopback would
// be reachable anyway: builds never reach the internet). FROM images come through the same
// registries as pulls: SANDBAR_REGISTRY_MIRROR for Docker Hub names, plain HTTP for loopback and
// listed insecure registries, credentials from an auth file of mode 0600 (never argv). The built
// image is written as an OCI layout that the store unpacks like a pulled one.

const BUILDAH = process.env.SANDBAR_BUILDAH ?? "buildah";

export interface BuildahRun {
  /** buildah's storage root (vfs) and run root. */
  root: string;
  runroot: string;
  /** Scratch dir for the Dockerfile, auth file and registries.conf. */
  scratch: string;
  mirror?: string;
  insecureRegistries: string[];
  /** Credentials per registry host (host[:port]) the FROM lines name (the mirror's for Docker Hub). */
  credentials: Record<string, RegistryCredentials>;
  signal?: AbortSignal;
  onLine: (line: string) => void;
}

/** The images the FROM lines of `dockerfile` name (not earlier stages, `scratch` or ARG-made names). */
function fromImages(dockerfile: string): string[] {
  const stages = new Set<string>();
  const out = new Set<string>();
  for (const raw of dockerfile.split("\n")) {
    const m = /^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?\s*$/i.exec(raw);
    if (!m) continue;
    const image = m[1]!;
    if (m[2]) stages.add(m[2].toLowerCase());
    if (stages.has(image.toLowerCase()) || image === "scratch" || image.includes("$")) continue;
    out.add(image);
  }
  return [...out];
}

/** The registries the FROM lines of `dockerfile` pull from (the mirror for Docker Hub names). */
export function fromRegistries(dockerfile: string, mirror?: string): string[] {
  const out = new Set<string>();
  for (const image of fromImages(dockerfile)) {
    let registry: string;
    try {
      registry = parseImageRef(image.includes(":") || image.includes("@") ? image : `${image}:x`).registry;
    } catch {
      continue; // buildah will say what is wrong with it
    }
    out.add(registry === DOCKER_HUB && mirror ? mirror : registry);
  }
  return [...out];
}

async function writeConfig(o: BuildahRun, registries: string[]): Promise<{ authfile: string; conf: string }> {
  const authfile = path.join(o.scratch, "auth.json");
  const auths: Record<string, { auth: string }> = {};
  for (const [host, c] of Object.entries(o.credentials)) auths[host] = { auth: Buffer.from(`${c.username}:${c.password}`).toString("base64") };
  await writeFile(authfile, JSON.stringify({ auths }), { mode: 0o600 });
  const insecure = (host: string) => isLoopbackRegistry(host) || o.insecureRegistries.includes(host);
  const lines = ['unqualified-search-registries = ["docker.io"]', 'short-name-mode = "permissive"'];
  if (o.mirror) lines.push("[[registry]]", 'prefix = "docker.io"', 'location = "docker.io"', "[[registry.mirror]]", `location = ${JSON.stringify(o.mirror)}`, `insecure = ${insecure(o.mirror)}`);
  for (const host of registries) if (host !== o.mirror && insecure(host)) lines.push("[[registry]]", `location = ${JSON.stringify(host)}`, "insecure = true");
  const conf = path.join(o.scratch, "registries.conf");
  await writeFile(conf, lines.join("\n") + "\n", { mode: 0o600 });
  return { authfile, conf };
}

function run(args: string[], o: BuildahRun, conf: string, offline = false): Promise<string[]> {
  return new Promise((resolve, reject) => {
    if (o.signal?.aborted) return reject(errors.deadlineExceeded("build was cancelled"));
    // Offline: in a network namespace of its own with nothing in it (chroot isolation runs RUN
    // steps in buildah's network, so this is what keeps them off the host's).
    const [cmd, argv] = offline ? ["unshare", ["--net", "--", BUILDAH, ...args]] : [BUILDAH, args];
    const child = spawn(cmd, argv, {
      stdio: ["ignore", "pipe", "pipe"],
      env: { PATH: process.env.PATH ?? "/usr/sbin:/usr/bin:/sbin:/bin", HOME: o.scratch, TMPDIR: o.scratch, CONTAINERS_REGISTRIES_CONF: conf, BUILDAH_ISOLATION: "chroot" },
    });
    const last: string[] = [];
    const onData = (carry: { s: string }) => (c: Buffer) => {
      carry.s += c.toString();
      const parts = carry.s.split(/\r?\n/);
      carry.s = parts.pop() ?? "";
      for (const line of parts) {
        o.onLine(line);
        last.push(line);
        if (last.length > 20) last.shift();
      }
    };
    const out = { s: "" };
    const err = { s: "" };
    child.stdout.on("data", onData(out));
    child.stderr.on("data", onData(err));
    const abort = () => child.kill("SIGKILL");
    o.signal?.addEventListener("abort", abort, { once: true });
    child.on("error", (e) => {
      o.signal?.removeEventListener("abort", abort);
      reject(errors.failedPrecondition(`cannot run buildah (install Debian's buildah package): ${e.message}`));
    });
    child.on("close", (code) => {
      o.signal?.removeEventListener("abort", abort);
      for (const rest of [out.s, err.s]) if (rest) (o.onLine(rest), last.push(rest));
      if (code === 0) return resolve(last);
      if (o.signal?.aborted) return reject(errors.deadlineExceeded("build was cancelled"));
      reject(new BuildFailed(last.filter((l) => l.trim() !== "").slice(-5).join("\n") || `buildah exited with ${code}`));
    });
  });
}

/** The build itself failed (the Dockerfile, a RUN step, a FROM image): its last lines. */
export class BuildFailed extends Error {}

/** Builds `dockerfile` over `contextDir` and writes the image as `oci:<layout>:image`. */
export async function buildahBuild(dockerfile: string, contextDir: string, layout: string, tag: string, o: BuildahRun): Promise<void> {
  const { authfile, conf } = await writeConfig(o, fromRegistries(dockerfile, o.mirror));
  const file = path.join(o.scratch, "Dockerfile");
  await writeFile(file, dockerfile, { mode: 0o600 });
  const global = ["--root", o.root, "--runroot", o.runroot, "--storage-driver", "vfs", "--registries-conf", conf];
  try {
    // FROM images first, on the host's network (registries on loopback, the mirror); the build
    // itself then runs offline and finds them in buildah's storage. Always asked of the registry
    // (unchanged layers are not fetched again): buildah's storage is shared by organizations, and
    // an image one of them pulled with its credentials must not serve another without them.
    for (const image of fromImages(dockerfile)) {
      o.onLine(`pulling ${image}`);
      await run([...global, "pull", "--policy", "always", "--authfile", authfile, "--arch", "amd64", "--os", "linux", "--quiet", image], o, conf);
    }
    await run([...global, "bud", "--isolation", "chroot", "--authfile", authfile, "--format", "oci", "--platform", "linux/amd64", "--pull=false", "-f", file, "-t", tag, contextDir], o, conf, true);
    await run([...global, "push", "--authfile", authfile, tag, `oci:${layout}:image`], o, conf);
  } finally {
    // The built image lives on in the store; buildah keeps its FROM images (cache for the next build).
    await run([...global, "rmi", "-f", tag], { ...o, onLine: () => undefined, signal: undefined }, conf).catch(() => undefined);
  }
}
