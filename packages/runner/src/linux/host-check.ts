import { execFile } from "node:child_process";
import { access, readFile } from "node:fs/promises";
import { promisify } from "node:util";
import { which } from "../host/command.ts";

// What this host offers sandboxes, and what is missing with the command that fixes it:
// `sandbar doctor` prints it, the server logs it at start.

export interface HostCheck {
  name: string;
  ok: boolean;
  /** What was found (a version, a mode) or what is wrong. */
  detail: string;
  /** The command that fixes it, when missing. */
  fix?: string;
  /** Sandboxes cannot run without it (others enable optional features). */
  required: boolean;
}

const run = promisify(execFile);

const readText = (file: string) => readFile(file, "utf8").catch(() => undefined);
const exists = (file: string) => access(file).then(() => true, () => false);

async function version(cmd: string, args: string[]): Promise<string> {
  try {
    const { stdout, stderr } = await run(cmd, args, { timeout: 5000 });
    return (stdout || stderr).trim().split("\n")[0] ?? "";
  } catch {
    return "";
  }
}

function tool(name: string, binary: string, pkg: string, required: boolean, versionArgs = ["--version"]): () => Promise<HostCheck> {
  return async () => {
    const found = which(binary);
    if (!found) return { name, ok: false, detail: `${binary} not found`, fix: `apt-get install -y ${pkg}`, required };
    return { name, ok: true, detail: (await version(found, versionArgs)) || found, required };
  };
}

const CHECKS: Array<() => Promise<HostCheck>> = [
  async () => {
    const root = process.getuid?.() === 0;
    return { name: "root", ok: root, detail: root ? "running as root" : `running as uid ${process.getuid?.()}: sandbox calls answer 503`, fix: root ? undefined : "run the server as root", required: true };
  },
  async () => {
    const v2 = await readText("/sys/fs/cgroup/cgroup.controllers");
    if (v2 !== undefined) {
      const have = v2.trim().split(/\s+/);
      const missing = ["memory", "pids", "cpu"].filter((c) => !have.includes(c));
      return { name: "cgroups", ok: missing.length === 0, detail: `v2 (${have.join(" ")})${missing.length ? `; missing ${missing.join(", ")}` : ""}`, required: true };
    }
    const v1 = (await readText("/proc/cgroups")) ?? "";
    const enabled = v1.split("\n").filter((l) => /\s1$/.test(l.trim())).map((l) => l.split(/\s+/)[0]);
    const missing = ["memory", "pids", "cpu"].filter((c) => !enabled.includes(c));
    return { name: "cgroups", ok: missing.length === 0, detail: `v1 (${enabled.join(" ")})${missing.length ? `; missing ${missing.join(", ")}` : ""}`, required: true };
  },
  async () => {
    const maxNs = Number((await readText("/proc/sys/user/max_user_namespaces"))?.trim() ?? "0");
    return { name: "user namespaces", ok: maxNs > 0, detail: `max_user_namespaces=${maxNs}`, fix: maxNs > 0 ? undefined : "sysctl -w user.max_user_namespaces=15000", required: true };
  },
  async () => {
    const ok = ((await readText("/proc/filesystems")) ?? "").includes("\toverlay");
    return { name: "overlayfs", ok, detail: ok ? "supported" : "not in /proc/filesystems", fix: ok ? undefined : "modprobe overlay", required: true };
  },
  tool("bubblewrap", "bwrap", "bubblewrap", true),
  tool("setpriv", "setpriv", "util-linux", true),
  async () => {
    const ok = await exists("/usr/bin/python3") && (await version("/usr/bin/python3", ["-c", "import seccomp; print('libseccomp', seccomp.__name__)"])).startsWith("libseccomp");
    return { name: "seccomp compiler", ok, detail: ok ? "python3-seccomp" : "python3-seccomp is missing", fix: ok ? undefined : "apt-get install -y python3-seccomp", required: true };
  },
  async () => {
    const ok = await exists("/dev/loop-control");
    return { name: "loop devices", ok, detail: ok ? "/dev/loop-control" : "no /dev/loop-control: disk caps unavailable", fix: ok ? undefined : "modprobe loop", required: false };
  },
  tool("ext4 tools", "mkfs.ext4", "e2fsprogs", false, ["-V"]),
  tool("debootstrap", "debootstrap", "debootstrap", false),
  tool("git", "git", "git", false),
  tool("skopeo (images)", "skopeo", "skopeo", false),
  tool("buildah (declarative builds)", "buildah", "buildah", false),
  tool("nftables (network policy)", "nft", "nftables", false),
  async () => {
    const client = which("docker");
    const daemon = await exists("/var/run/docker.sock");
    return { name: "docker", ok: Boolean(client) && daemon, detail: client ? (daemon ? "client and daemon" : "client only, no daemon running") : "not installed", fix: client ? undefined : "apt-get install -y docker.io", required: false };
  },
];

export async function checkHost(): Promise<HostCheck[]> {
  return Promise.all(CHECKS.map((c) => c()));
}

/** One line per check: `ok`, `missing` (required) or `absent` (optional), with the fix. */
export function formatChecks(checks: HostCheck[]): string[] {
  return checks.map((c) => `${c.ok ? "ok     " : c.required ? "MISSING" : "absent "} ${c.name}: ${c.detail}${!c.ok && c.fix ? ` (fix: ${c.fix})` : ""}`);
}
