import type { ChildProcess } from "node:child_process";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { run } from "../../host/command.ts";

// "The internet" for egress tests, without traffic leaving the machine: a network namespace the
// test creates, wired to the host by a veth of its own on test-only addresses (198.18.0.0/15,
// RFC 2544), with two more addresses routed behind it, and an HTTP server answering every one of
// them with the address it was reached on ("inet <address>"). Needs root.

export interface FakeInternet {
  /** On the namespace's side of the veth. */
  inet: string;
  /** A second address, routed via `inet`. */
  far: string;
  /** 169.254.169.254, where clouds put their metadata service, behind `inet` too. */
  metadata: string;
  /** The host's side of the veth: a host address. */
  hostSide: string;
  port: number;
  close(): Promise<void>;
}

const ip = (...args: string[]) => run("ip", args);

export async function fakeInternet(port = 8080): Promise<FakeInternet> {
  const tag = randomBytes(3).toString("hex");
  const ns = `sbt-inet-${tag}`;
  const hostIf = `sbti${tag}`;
  // Each instance its own /30 and far address, so suites running at once do not collide.
  const n = randomBytes(1)[0] & 63;
  const inet = `198.18.${n}.1`;
  const hostSide = `198.18.${n}.2`;
  const far = `198.19.${n}.1`;
  const metadata = "169.254.169.254";
  let server: ChildProcess | undefined;
  const close = async () => {
    server?.kill();
    await ip("route", "del", `${far}/32`).catch(() => undefined);
    if (routedMetadata) await ip("route", "del", `${metadata}/32`, "via", inet).catch(() => undefined);
    await ip("link", "del", hostIf).catch(() => undefined);
    await ip("netns", "del", ns).catch(() => undefined);
  };
  let routedMetadata = false;
  try {
    await ip("netns", "add", ns);
    await ip("link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns);
    await ip("addr", "add", `${hostSide}/30`, "dev", hostIf);
    await ip("link", "set", hostIf, "up");
    await ip("-n", ns, "addr", "add", `${inet}/30`, "dev", "eth0");
    await ip("-n", ns, "link", "set", "eth0", "up");
    await ip("-n", ns, "link", "set", "lo", "up");
    await ip("-n", ns, "addr", "add", `${far}/32`, "dev", "lo");
    await ip("-n", ns, "addr", "add", `${metadata}/32`, "dev", "lo");
    await ip("route", "add", `${far}/32`, "via", inet);
    // Another suite's fake internet may hold the metadata route: then that one answers, equally refused.
    routedMetadata = await ip("route", "add", `${metadata}/32`, "via", inet).then(() => true, () => false);
    await ip("-n", ns, "route", "add", "default", "via", hostSide);
    const code = `require("http").createServer((q, s) => s.end("inet " + q.socket.localAddress.replace("::ffff:", ""))).listen(${port}, "0.0.0.0", () => console.log("up"))`;
    const child = spawn("ip", ["netns", "exec", ns, process.execPath, "-e", code], { stdio: ["ignore", "pipe", "inherit"] });
    server = child;
    await new Promise<void>((resolve, reject) => {
      child.stdout!.once("data", () => resolve());
      child.once("exit", (c) => reject(new Error(`the fake internet's server exited with ${c}`)));
    });
  } catch (err) {
    await close();
    throw err;
  }
  return { inet, far, metadata, hostSide, port, close };
}
