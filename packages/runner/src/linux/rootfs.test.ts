import { mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { acquireDirLock } from "./dir-lock.ts";
import { LinuxProvider } from "./provider.ts";
import { debianMirror, DEFAULT_PACKAGES, ensureDefaultSnapshot } from "./rootfs.ts";
import { execAgentBundle, sh, uniqueId } from "./testing/harness.ts";

// The default snapshot. The debootstrap build is real (Debian's archive, a minute or two on a
// fresh machine) and cached under SANDBAR_TEST_CACHE_DIR (default /var/tmp/sandbar-runner-test-cache),
// so reruns reuse it.

const cacheDir = process.env.SANDBAR_TEST_CACHE_DIR ?? "/var/tmp/sandbar-runner-test-cache";
const scratch: string[] = [];

afterAll(async () => {
  for (const d of scratch) await rm(d, { recursive: true, force: true });
});

async function tempDir(): Promise<string> {
  const d = await mkdtemp(path.join(os.tmpdir(), "sandbar-rootfs-"));
  scratch.push(d);
  return d;
}

async function runIn(dataDir: string, snapshot: { rootfs: string; mounts: { source: string; target: string; readonly?: boolean }[] }, script: string): Promise<string> {
  const provider = await LinuxProvider.open({ dataDir, uidBase: 1_700_000_000 + Math.floor(Math.random() * 60_000) * 16, uidCount: 16 });
  const id = uniqueId("rootfs");
  try {
    await provider.create({
      id,
      rootfs: snapshot.rootfs,
      mounts: snapshot.mounts,
      cpu: 1,
      memoryGiB: 1,
      pidsLimit: 256,
      init: { node: process.execPath, bundle: await execAgentBundle() },
    });
    await provider.start(id);
    const res = await sh(provider, id, script);
    expect(res.stderr).toBe("");
    return res.stdout;
  } finally {
    await provider.destroy(id);
    await provider.close();
  }
}

describe("debian mirror from apt sources", () => {
  it("reads deb822 .sources, skipping the security archive", async () => {
    const apt = await tempDir();
    await mkdir(path.join(apt, "sources.list.d"));
    await writeFile(
      path.join(apt, "sources.list.d", "debian.sources"),
      "Types: deb\nURIs: http://security.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\n\n" +
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n",
    );
    expect(await debianMirror("bookworm", apt)).toBe("http://mirror.example/debian");
  });

  it("reads one-line sources.list, and defaults to deb.debian.org", async () => {
    const apt = await tempDir();
    await writeFile(path.join(apt, "sources.list"), "# comment\ndeb [arch=amd64] https://other.example/debian bookworm main\n");
    expect(await debianMirror("bookworm", apt)).toBe("https://other.example/debian");
    expect(await debianMirror("trixie", apt)).toBe("http://deb.debian.org/debian");
  });
});

describe("build lock", () => {
  it("makes a second holder wait, and breaks a lock whose owner is dead", async () => {
    const dir = path.join(await tempDir(), "lock");
    const release = await acquireDirLock(dir);
    let second = false;
    const waiting = acquireDirLock(dir).then((r) => {
      second = true;
      return r;
    });
    await new Promise((r) => setTimeout(r, 400));
    expect(second).toBe(false);
    await release();
    await (await waiting)();
    // A crashed owner: pid that cannot exist.
    await mkdir(dir);
    await writeFile(path.join(dir, "pid"), "4194304");
    const broken = await acquireDirLock(dir);
    expect(await readFile(path.join(dir, "pid"), "utf8")).toBe(String(process.pid));
    await broken();
  });
});

describe("default snapshot", () => {
  it("falls back, loudly, to a root over the host's /usr", async () => {
    const dataDir = await tempDir();
    const warnings: string[] = [];
    const snap = await ensureDefaultSnapshot({ dataDir, forceFallback: true, log: (l) => warnings.push(l) });
    expect(snap.kind).toBe("host-usr");
    expect(snap.mounts[0]).toEqual({ source: "/usr", target: "/usr", readonly: true });
    expect(warnings.join("\n")).toContain("FALLBACK");
    expect(await runIn(dataDir, snap, "cat /etc/os-release | head -1; ls /usr/bin/env")).toBe('PRETTY_NAME="sandbar host-usr fallback"\n/usr/bin/env\n');
  });

  it(
    "builds Debian bookworm minbase with debootstrap once, atomically, and reuses it",
    async () => {
      const progress: string[] = [];
      const [snap, same] = await Promise.all([
        ensureDefaultSnapshot({ dataDir: cacheDir, onProgress: (l) => progress.push(l) }),
        ensureDefaultSnapshot({ dataDir: cacheDir }),
      ]);
      expect(same).toBe(snap); // one build for concurrent callers
      expect(snap.kind).toBe("debootstrap");
      expect(snap.mounts).toEqual([]);
      const manifest = JSON.parse(await readFile(path.join(path.dirname(snap.rootfs), "snapshot.json"), "utf8")) as { packages: string[] };
      expect(manifest.packages).toEqual(DEFAULT_PACKAGES);
      if (progress.length > 0) {
        // Built in this run: debootstrap's own progress came through.
        expect(progress.some((l) => l.startsWith("I: "))).toBe(true);
        expect(progress.at(-1)).toContain("default snapshot ready");
      }
      // No scratch or lock left behind.
      const { readdir } = await import("node:fs/promises");
      expect((await readdir(path.join(cacheDir, "snapshots"))).filter((n) => n.startsWith("."))).toEqual([]);
      expect((await stat(path.join(snap.rootfs, "usr/bin/python3"))).isFile()).toBe(true);

      const out = await runIn(
        cacheDir,
        snap,
        [
          "cut -d. -f1 /etc/debian_version",
          // pylsp loads its plugins through setuptools' entry points: without it, no completions.
          "python3 -c 'import pylsp, setuptools, jedi; print(\"pylsp\")'",
          "git --version | cut -d' ' -f1-2",
          "ls /etc/ssl/certs/ca-certificates.crt",
          "ps -e -o comm= | head -1",
          "node -e 'console.log(typeof process.version)'",
        ].join("; "),
      );
      expect(out).toBe("12\npylsp\ngit version\n/etc/ssl/certs/ca-certificates.crt\ninit-sh\nstring\n");
    },
    20 * 60_000,
  );
});
