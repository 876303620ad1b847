import { execFileSync } from "node:child_process";

// A network namespace for a test's runner process: a veth pair to the host's namespace, the
// runner's side at `address`, the host's at `hostAddress` (a /30 of 10.216.0.0/16). Control,
// in the host's namespace, reaches the runner only through it, as it would another machine.

export interface TestNetns {
  name: string;
  address: string;
  hostAddress: string;
  remove(): void;
}

const ip = (...args: string[]) => execFileSync("ip", args, { stdio: ["ignore", "ignore", "pipe"] });

export function createTestNetns(index: number): TestNetns {
  const tag = `${process.pid % 10000}${index}`;
  const name = `sbrt-${tag}`;
  const [host, inner] = [`sbrth${tag}`, `sbrtn${tag}`];
  const octet = (process.pid % 60) * 4 + index;
  const base = `10.216.${octet % 256}`;
  const hostAddress = `${base}.1`;
  const address = `${base}.2`;
  ip("netns", "add", name);
  try {
    ip("link", "add", host, "type", "veth", "peer", "name", inner);
    ip("link", "set", inner, "netns", name);
    ip("addr", "add", `${hostAddress}/30`, "dev", host);
    ip("link", "set", host, "up");
    ip("-n", name, "addr", "add", `${address}/30`, "dev", inner);
    ip("-n", name, "link", "set", inner, "up");
    ip("-n", name, "link", "set", "lo", "up");
  } catch (err) {
    remove();
    throw err;
  }
  function remove() {
    try {
      ip("link", "del", host);
    } catch {
      // gone with the namespace already
    }
    try {
      ip("netns", "del", name);
    } catch {
      // never made
    }
  }
  return { name, address, hostAddress, remove };
}
