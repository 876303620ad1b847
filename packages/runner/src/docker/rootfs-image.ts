import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { realpath, stat } from "node:fs/promises";
import type Docker from "dockerode";
import { errors } from "@sandbar/protocol";
import { KeyedLock } from "../host/keyed-lock.ts";

// A snapshot is a root filesystem directory (the default snapshot, or an OCI image unpacked by the
// image store); the engine needs an image. Each directory is imported once (`docker import` of a
// tar stream of it, never a file on disk) and named by its identity, so a rebuilt snapshot gets a
// new image and a restarted runner finds the old one.

const ROOTFS_REPO = "sandbar-rootfs";

export class RootfsImages {
  readonly #docker: Docker;
  readonly #lock = new KeyedLock();
  readonly #log: (line: string) => void;

  constructor(docker: Docker, log: (line: string) => void) {
    this.#docker = docker;
    this.#log = log;
  }

  /** The image holding `rootfs` (imported on first use). */
  async imageFor(rootfs: string): Promise<string> {
    const tag = await rootfsTag(rootfs);
    const name = `${ROOTFS_REPO}:${tag}`;
    return this.#lock.with(name, async () => {
      if (await this.#exists(name)) return name;
      const started = Date.now();
      await this.#import(rootfs, tag);
      this.#log(`imported snapshot ${rootfs} as ${name} in ${Date.now() - started} ms`);
      return name;
    });
  }

  async #exists(name: string): Promise<boolean> {
    try {
      await this.#docker.getImage(name).inspect();
      return true;
    } catch (err) {
      if ((err as { statusCode?: number }).statusCode === 404) return false;
      throw err;
    }
  }

  async #import(rootfs: string, tag: string): Promise<void> {
    const tar = spawn("tar", ["--create", "--file=-", "--directory", rootfs, "--numeric-owner", "--xattrs", "--xattrs-include=security.capability", "."], { stdio: ["ignore", "pipe", "pipe"] });
    let stderr = "";
    tar.stderr.on("data", (c: Buffer) => (stderr = (stderr + c.toString()).slice(-2000)));
    const tarDone = new Promise<void>((resolve, reject) => {
      tar.on("error", reject);
      tar.on("close", (code) => (code === 0 ? resolve() : reject(new Error(`tar of ${rootfs} exited with ${code}: ${stderr.trim()}`))));
    });
    tarDone.catch(() => undefined);
    const progress = await this.#docker.importImage(tar.stdout, { repo: ROOTFS_REPO, tag });
    await new Promise<void>((resolve, reject) => {
      this.#docker.modem.followProgress(progress, (err: Error | null, out: Array<{ error?: string }>) => {
        const failed = err?.message ?? out.find((o) => o.error)?.error;
        if (failed) reject(errors.failedPrecondition(`importing snapshot ${rootfs} into the engine failed: ${failed}`));
        else resolve();
      });
    });
    await tarDone;
  }
}

/** A tag naming `rootfs` by its real path, device, inode and change time. */
async function rootfsTag(rootfs: string): Promise<string> {
  const real = await realpath(rootfs);
  const s = await stat(real, { bigint: true });
  return createHash("sha256").update([real, s.dev, s.ino, s.ctimeNs].join(":")).digest("hex").slice(0, 24);
}
