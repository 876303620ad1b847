// The bubblewrap command line for a sandbox. Pure: it only builds arguments.
//
// bwrap runs as the sandbox's host uid (see launcher.ts), so it creates a user namespace
// mapping that uid to `uid` inside; every other namespace is new too, the network one holds
// only `lo`, all capabilities are dropped and nothing of the host's environment is kept.

export interface BwrapMount {
  source: string;
  target: string;
  readonly: boolean;
}

export interface BwrapPlan {
  /** Host path of the mounted root (the overlay). */
  root: string;
  hostname: string;
  uid: number;
  gid: number;
  env: Record<string, string>;
  cwd: string;
  /** Applied in order after the root, /proc and /dev. */
  mounts: BwrapMount[];
  /** Join the namespace bwrap is started in (a sandbox with egress) instead of a new loopback-only one. */
  shareNet?: boolean;
  /** Size of /dev/shm (a tmpfs charged to the sandbox's memory); default the kernel's (half the host's RAM). */
  shmBytes?: number;
}

/** bwrap's options (sent over `--args FD`: keeps env values out of `ps` on the host). */
export function bwrapOptions(plan: BwrapPlan): string[] {
  const a: string[] = [
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    ...(plan.shareNet ? [] : ["--unshare-net"]),
    "--unshare-cgroup",
    // No nested user namespaces: they would hand the sandbox capabilities (inside them) and with
    // them much more kernel surface (mounting, netfilter, ...).
    "--disable-userns",
    "--uid", String(plan.uid),
    "--gid", String(plan.gid),
    "--hostname", plan.hostname,
    // A new session: no access to a controlling terminal of the runner (TIOCSTI).
    "--new-session",
    // The command is pid 1 itself (see INIT_SCRIPT in provider.ts).
    "--as-pid-1",
    "--cap-drop", "ALL",
    "--clearenv",
  ];
  for (const [k, v] of Object.entries(plan.env)) a.push("--setenv", k, v);
  a.push("--bind", plan.root, "/", "--proc", "/proc", "--dev", "/dev", "--perms", "1777", ...(plan.shmBytes ? ["--size", String(plan.shmBytes)] : []), "--tmpfs", "/dev/shm");
  for (const m of plan.mounts) a.push(m.readonly ? "--ro-bind" : "--bind", m.source, m.target);
  a.push("--chdir", plan.cwd);
  return a;
}

/** bwrap's `--args FD` format: NUL-terminated arguments. bwrap 0.8 ignores a command given there. */
export function encodeArgs(args: readonly string[]): Buffer {
  return Buffer.from(args.map((x) => x + "\0").join(""));
}
