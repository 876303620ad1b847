import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdir, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { errors } from "@sandbar/protocol";

// The seccomp filter of every sandbox process (DESIGN.md decision 15): everything is allowed but
// what a sandbox never needs, which fails with EPERM (a program probing for a feature gets a clean
// "not permitted" instead of being killed). bwrap installs it right before exec'ing the sandbox's
// first process, so every process inside inherits it and none can remove it.
//
// The classic-BPF program is compiled by libseccomp (Debian's python3-seccomp), once per rule set,
// into the runner's data dir; the launcher hands bwrap an fd to it (`--seccomp FD`).

/** Refused inside sandboxes, grouped by why. */
const BLOCKED_SYSCALLS: Readonly<Record<string, readonly string[]>> = {
  "kernel keyrings (shared across the host, not namespaced)": ["add_key", "request_key", "keyctl"],
  "kernel programs and tracing": ["bpf", "perf_event_open", "lookup_dcookie"],
  "userfaultfd (a staple of kernel exploits)": ["userfaultfd"],
  "io_uring (a large, often-exploited kernel surface)": ["io_uring_setup", "io_uring_enter", "io_uring_register"],
  "kernel modules and replacing the kernel": ["init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load"],
  "the host's clock": ["clock_settime", "clock_adjtime", "settimeofday", "adjtimex"],
  "the host itself": ["reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "nfsservctl"],
  "mounts and file handles (reach past the mount namespace)": ["mount", "umount2", "pivot_root", "open_by_handle_at", "name_to_handle_at", "fsopen", "fsmount", "fsconfig", "move_mount", "open_tree"],
  "raw port I/O": ["iopl", "ioperm"],
};

// ptrace stays allowed: debuggers and strace are everyday tools, and since Linux 4.8 a traced
// process cannot use ptrace to get around seccomp. Namespace creation is already refused by bwrap
// (--disable-userns) and by the missing capabilities.

const COMPILER = `
import errno, json, sys, seccomp
names = json.load(sys.stdin)
f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
# 32-bit x86 programs get the same rules; any other ABI (x32) is refused whole.
f.add_arch(seccomp.Arch.X86)
f.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.ERRNO(errno.EPERM))
for name in names:
    try:
        f.add_rule(seccomp.ERRNO(errno.EPERM), name)
    except (ValueError, RuntimeError, OSError):
        pass  # not a system call of these architectures
with open(sys.argv[1], "wb") as out:
    f.export_bpf(out)
`;

const run = promisify(execFile);

/** Every blocked call, flat. */
export function blockedSyscalls(): string[] {
  return Object.values(BLOCKED_SYSCALLS).flat();
}

/** The compiled filter for the current rules in `dir` (made once), as a file path. */
export async function syscallFilter(dir: string): Promise<string> {
  const names = blockedSyscalls();
  const key = createHash("sha256").update(COMPILER).update(JSON.stringify(names)).digest("hex").slice(0, 12);
  const file = path.join(dir, `seccomp-${key}.bpf`);
  if (await stat(file).then((s) => s.size > 0, () => false)) return file;
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const tmp = `${file}.${process.pid}.tmp`;
  try {
    // Debian's python: the one python3-seccomp installs into (not a pyenv or venv first on PATH).
    const child = run("/usr/bin/python3", ["-c", COMPILER, tmp]);
    child.child.stdin?.end(JSON.stringify(names));
    await child;
    await rename(tmp, file);
  } catch (err) {
    await rm(tmp, { force: true });
    const why = (err as { stderr?: string }).stderr?.includes("No module named 'seccomp'") ? "python3-seccomp is not installed: apt-get install python3-seccomp" : (err as Error).message;
    throw errors.failedPrecondition(`cannot compile the sandbox seccomp filter: ${why}`);
  }
  return file;
}
