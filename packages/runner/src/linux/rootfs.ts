import { createHash } from "node:crypto";
import { spawn } from "node:child_process";
import { chmod, copyFile, lstat, mkdir, readdir, readFile, readlink, rename, rm, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { createInterface } from "node:readline";
import type { BindMount } from "../provider.ts";
import { isErrno } from "../host/files.ts";
import { run, which } from "../host/command.ts";
import { acquireDirLock } from "./dir-lock.ts";

// The default snapshot: Debian bookworm minbase from Debian's archive (debootstrap), with git,
// python3, python3-pylsp, ca-certificates and procps. node and typescript-language-server are not
// copied in: the runner binds the host's at start. Built once per data dir, under a lock, into a
// scratch directory renamed into place when complete; reused afterwards.
//
// When the host cannot run debootstrap (not installed and not installable, or the archive is
// unreachable), a minimal root is assembled instead whose /usr is the host's, bound read-only
// at start. That fallback is logged loudly: sandboxes then see the host's programs.

export interface Snapshot {
  /** Directory to use as a sandbox's `rootfs`. */
  rootfs: string;
  /** Binds the snapshot needs at start (the host-/usr fallback binds /usr); put them first in `mounts`. */
  mounts: BindMount[];
  kind: "debootstrap" | "host-usr";
}

// python3-setuptools: pylsp finds its plugins (jedi completions, symbols) through setuptools' entry points.
export const DEFAULT_PACKAGES = ["git", "python3", "python3-pylsp", "python3-setuptools", "ca-certificates", "procps"];
const DEFAULT_SUITE = "bookworm";

export interface DefaultSnapshotOptions {
  /** The runner's data dir; snapshots go to `<dataDir>/snapshots/`. */
  dataDir: string;
  /** Build progress, one line at a time (debootstrap's output). */
  onProgress?: (line: string) => void;
  /** Warnings (the fallback). Default: console.warn. */
  log?: (line: string) => void;
  /** Archive to use; default: the bookworm mirror of the host's apt sources. */
  mirror?: string;
  packages?: string[];
  /** Try `apt-get install debootstrap` when it is missing; default true. */
  installDebootstrap?: boolean;
  /** Skip debootstrap (tests of the fallback). */
  forceFallback?: boolean;
}

interface Manifest {
  kind: Snapshot["kind"];
  mounts: BindMount[];
  builtAt: string;
  suite?: string;
  mirror?: string;
  packages?: string[];
}

const building = new Map<string, Promise<Snapshot>>();

/** The default snapshot, built on first use. Concurrent callers share one build. */
export function ensureDefaultSnapshot(options: DefaultSnapshotOptions): Promise<Snapshot> {
  const key = `${path.resolve(options.dataDir)}|${options.forceFallback ? "fallback" : "default"}`;
  let p = building.get(key);
  if (!p) {
    p = buildOrReuse(options);
    building.set(key, p);
    p.catch(() => building.delete(key));
  }
  return p;
}

async function buildOrReuse(o: DefaultSnapshotOptions): Promise<Snapshot> {
  const dir = path.join(path.resolve(o.dataDir), "snapshots");
  const progress = o.onProgress ?? (() => undefined);
  const warn = o.log ?? ((l: string) => console.warn(l));
  await mkdir(dir, { recursive: true, mode: 0o755 });
  // Named by what goes in: a changed package list builds a new snapshot beside the old one,
  // which sandboxes created from it keep using as their lower layer.
  const contents = createHash("sha256").update([DEFAULT_SUITE, ...(o.packages ?? DEFAULT_PACKAGES)].join(" ")).digest("hex").slice(0, 10);
  const debian = path.join(dir, `debian-${DEFAULT_SUITE}-${contents}`);
  const hostUsr = path.join(dir, "host-usr");

  if (!o.forceFallback) {
    const ready = await readManifest(debian);
    if (ready) return toSnapshot(debian, ready);
    const release = await acquireDirLock(path.join(dir, ".build.lock"), (pid) => progress(`waiting for the snapshot build of process ${pid}`));
    try {
      const again = await readManifest(debian);
      if (again) return toSnapshot(debian, again);
      const reason = await debootstrapUnavailable(o, progress);
      if (reason === undefined) {
        try {
          return await buildDebootstrap(debian, o, progress);
        } catch (err) {
          warn(`sandbar: building the default snapshot with debootstrap failed: ${(err as Error).message}`);
        }
      } else {
        warn(`sandbar: debootstrap is unavailable (${reason})`);
      }
    } finally {
      await release();
    }
  }

  warn(
    "sandbar: FALLBACK snapshot in use: a minimal root whose /usr is the host's /usr, bound read-only. " +
      "Sandboxes see the host's programs and libraries. Install debootstrap for the Debian snapshot.",
  );
  const ready = await readManifest(hostUsr);
  if (ready) return toSnapshot(hostUsr, ready);
  const release = await acquireDirLock(path.join(dir, ".build.lock"));
  try {
    const again = await readManifest(hostUsr);
    if (again) return toSnapshot(hostUsr, again);
    const scratch = await scratchDir(dir, "host-usr");
    const mounts = await buildHostUsrRootfs(path.join(scratch, "rootfs"));
    await finish(scratch, hostUsr, { kind: "host-usr", mounts, builtAt: new Date().toISOString() });
    progress(`fallback snapshot ready at ${hostUsr}/rootfs`);
    return toSnapshot(hostUsr, (await readManifest(hostUsr))!);
  } finally {
    await release();
  }
}

function toSnapshot(dir: string, m: Manifest): Snapshot {
  return { rootfs: path.join(dir, "rootfs"), mounts: m.mounts, kind: m.kind };
}

async function readManifest(dir: string): Promise<Manifest | undefined> {
  try {
    return JSON.parse(await readFile(path.join(dir, "snapshot.json"), "utf8")) as Manifest;
  } catch (err) {
    if (isErrno(err, "ENOENT")) return undefined;
    throw err;
  }
}

async function scratchDir(parent: string, name: string): Promise<string> {
  const d = path.join(parent, `.${name}.building-${process.pid}-${Date.now()}`);
  await mkdir(d, { mode: 0o755 });
  return d;
}

/** Writes the manifest and renames the scratch dir into place: a snapshot is complete or absent. */
async function finish(scratch: string, final: string, m: Manifest): Promise<void> {
  await writeFile(path.join(scratch, "snapshot.json"), JSON.stringify(m, null, 2));
  await rm(final, { recursive: true, force: true });
  await rename(scratch, final);
}

// ---- debootstrap ----------------------------------------------------------------------------

async function debootstrapUnavailable(o: DefaultSnapshotOptions, progress: (l: string) => void): Promise<string | undefined> {
  if (which("debootstrap")) return undefined;
  if (o.installDebootstrap === false) return "not installed";
  if (process.getuid?.() !== 0 || !which("apt-get")) return "not installed, and apt-get cannot be used here";
  progress("debootstrap is not installed; installing it with apt-get");
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
  const install = () => run("apt-get", ["install", "-y", "--no-install-recommends", "debootstrap"], { env });
  try {
    await install();
  } catch {
    try {
      await run("apt-get", ["update"], { env });
      await install();
    } catch (err) {
      return `not installed, and apt-get could not install it: ${(err as Error).message.slice(0, 500)}`;
    }
  }
  return which("debootstrap") ? undefined : "apt-get ran but debootstrap is still missing";
}

async function buildDebootstrap(final: string, o: DefaultSnapshotOptions, progress: (l: string) => void): Promise<Snapshot> {
  const dir = path.dirname(final);
  const mirror = o.mirror ?? (await debianMirror(DEFAULT_SUITE));
  const packages = o.packages ?? DEFAULT_PACKAGES;
  const scratch = await scratchDir(dir, `debian-${DEFAULT_SUITE}`);
  const rootfs = path.join(scratch, "rootfs");
  try {
    progress(`building the default snapshot: debootstrap --variant=minbase ${DEFAULT_SUITE} from ${mirror} with ${packages.join(", ")}`);
    const started = Date.now();
    await streamed(
      "debootstrap",
      ["--variant=minbase", `--include=${packages.join(",")}`, DEFAULT_SUITE, rootfs, mirror],
      progress,
    );
    await tidyDebootstrap(rootfs);
    await finish(scratch, final, { kind: "debootstrap", mounts: [], builtAt: new Date().toISOString(), suite: DEFAULT_SUITE, mirror, packages });
    progress(`default snapshot ready at ${final}/rootfs (${Math.round((Date.now() - started) / 1000)} s)`);
    return toSnapshot(final, (await readManifest(final))!);
  } catch (err) {
    await rm(scratch, { recursive: true, force: true }).catch(() => undefined);
    throw err;
  }
}

/** Drops downloaded packages and adds the runner's mount points. */
async function tidyDebootstrap(rootfs: string): Promise<void> {
  const debs = path.join(rootfs, "var/cache/apt/archives");
  for (const f of await readdir(debs).catch(() => [] as string[])) if (f.endsWith(".deb")) await rm(path.join(debs, f));
  for (const d of ["opt/sandbar/bin", "opt/sandbar/agent", "run/sandbar"]) await mkdir(path.join(rootfs, d), { recursive: true, mode: 0o755 });
}

/** Runs a command, handing each output line to `progress`; rejects with the last lines on failure. */
function streamed(cmd: string, args: string[], progress: (l: string) => void): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" } });
    const tail: string[] = [];
    const onLine = (line: string) => {
      tail.push(line);
      if (tail.length > 20) tail.shift();
      progress(line);
    };
    createInterface({ input: child.stdout }).on("line", onLine);
    createInterface({ input: child.stderr }).on("line", onLine);
    child.on("error", reject);
    child.on("close", (code, signal) => {
      if (code === 0) resolve();
      else reject(new Error(`${cmd} ${signal ?? `exited with ${code}`}: ${tail.join("\n")}`));
    });
  });
}

/**
 * The Debian archive the host's apt uses for `suite` (deb822 .sources or one-line .list files);
 * http://deb.debian.org/debian when none is found.
 */
export async function debianMirror(suite: string, aptDir = "/etc/apt"): Promise<string> {
  const files = [path.join(aptDir, "sources.list")];
  for (const f of await readdir(path.join(aptDir, "sources.list.d")).catch(() => [] as string[])) files.push(path.join(aptDir, "sources.list.d", f));
  for (const file of files) {
    const text = await readFile(file, "utf8").catch(() => "");
    const found = file.endsWith(".sources") ? fromDeb822(text, suite) : fromOneLine(text, suite);
    if (found) return found;
  }
  return "http://deb.debian.org/debian";
}

function isDebianArchive(uri: string): boolean {
  return /^https?:\/\//.test(uri) && !uri.includes("security") && /\/debian\/?$/.test(uri);
}

function fromDeb822(text: string, suite: string): string | undefined {
  for (const stanza of text.split(/\n\s*\n/)) {
    const field = (name: string) => new RegExp(`^${name}:\\s*(.+)$`, "mi").exec(stanza)?.[1].trim().split(/\s+/) ?? [];
    if (!field("Types").includes("deb") || !field("Suites").includes(suite)) continue;
    const uri = field("URIs").find(isDebianArchive);
    if (uri) return uri.replace(/\/$/, "");
  }
  return undefined;
}

function fromOneLine(text: string, suite: string): string | undefined {
  for (const raw of text.split("\n")) {
    const line = raw.replace(/#.*/, "").replace(/\[[^\]]*\]/, "").trim().split(/\s+/);
    if (line[0] === "deb" && line[2] === suite && isDebianArchive(line[1])) return line[1].replace(/\/$/, "");
  }
  return undefined;
}

// ---- host-/usr fallback ---------------------------------------------------------------------

/**
 * A minimal root for `target`: its own /etc, /tmp, /home..., with /usr (and any top-level
 * library or binary directory that is not a /usr symlink on this host) bound read-only from the
 * host at start. Returns those binds. Also used by tests as a small, quick snapshot.
 */
export async function buildHostUsrRootfs(target: string): Promise<BindMount[]> {
  const mounts: BindMount[] = [{ source: "/usr", target: "/usr", readonly: true }];
  await mkdir(target, { recursive: true, mode: 0o755 });
  for (const d of ["etc", "usr", "proc", "dev", "sys", "run/sandbar", "home", "opt/sandbar/bin", "opt/sandbar/agent", "mnt", "srv", "var/lib", "var/cache", "var/log"]) {
    await mkdir(path.join(target, d), { recursive: true, mode: 0o755 });
  }
  for (const [d, mode] of [["tmp", 0o1777], ["var/tmp", 0o1777], ["root", 0o700]] as const) {
    await mkdir(path.join(target, d), { recursive: true });
    await chmod(path.join(target, d), mode);
  }
  // Merged-/usr hosts have /bin -> usr/bin etc.; copy those links, bind real directories.
  for (const top of ["bin", "sbin", "lib", "lib32", "lib64", "libx32"]) {
    const st = await lstat(path.join("/", top)).catch(() => undefined);
    if (!st) continue;
    if (st.isSymbolicLink()) await symlink(await readlink(path.join("/", top)), path.join(target, top));
    else if (st.isDirectory()) {
      await mkdir(path.join(target, top), { mode: 0o755 });
      mounts.push({ source: path.join("/", top), target: path.join("/", top), readonly: true });
    }
  }
  const etc = path.join(target, "etc");
  await writeFile(path.join(etc, "passwd"), "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
  await writeFile(path.join(etc, "group"), "root:x:0:\nnogroup:x:65534:\n");
  await writeFile(path.join(etc, "hosts"), "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
  await writeFile(path.join(etc, "nsswitch.conf"), "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n");
  await writeFile(path.join(etc, "os-release"), 'PRETTY_NAME="sandbar host-usr fallback"\nID=sandbar-host-usr\n');
  for (const f of ["ld.so.cache", "ld.so.conf"]) await copyFile(path.join("/etc", f), path.join(etc, f)).catch(() => undefined);
  // Debian's /usr/bin links go through /etc/alternatives.
  const alts = await readdir("/etc/alternatives").catch(() => [] as string[]);
  await mkdir(path.join(etc, "alternatives"), { mode: 0o755 });
  for (const a of alts) {
    const link = await readlink(path.join("/etc/alternatives", a)).catch(() => undefined);
    if (link) await symlink(link, path.join(etc, "alternatives", a));
  }
  const ssl = await lstat("/etc/ssl").catch(() => undefined);
  if (ssl?.isDirectory()) {
    await mkdir(path.join(etc, "ssl"), { mode: 0o755 });
    mounts.push({ source: "/etc/ssl", target: "/etc/ssl", readonly: true });
  }
  return mounts;
}
