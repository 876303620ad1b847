import { readFile } from "node:fs/promises";
import { type AddressInfo, createServer } from "node:net";

/**
 * A TCP port free on loopback right now, for a listener that starts a little later (a server that
 * must know its URL first, PostgreSQL). Chosen below the kernel's ephemeral range: a port the
 * kernel picks is in that range, where any outgoing connection may take it before its user
 * listens on it (seen as EADDRINUSE when many servers start at once).
 */
export async function freePort(): Promise<number> {
  const low = await ephemeralLow();
  const span = Math.min(12_000, low - 1025);
  for (let i = 0; span > 0 && i < 50; i++) {
    const port = low - 1 - Math.floor(Math.random() * span);
    if ((await listenOn(port)) !== undefined) return port;
  }
  const port = await listenOn(0);
  if (port === undefined) throw new Error("no free TCP port on 127.0.0.1");
  return port;
}

async function ephemeralLow(): Promise<number> {
  const text = await readFile("/proc/sys/net/ipv4/ip_local_port_range", "utf8").catch(() => "32768");
  return Number.parseInt(text, 10) || 32768;
}

/** Listens on `port` (0: any) and closes again; the port, or undefined when it is taken. */
function listenOn(port: number): Promise<number | undefined> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once("error", () => resolve(undefined));
    srv.listen(port, "127.0.0.1", () => {
      const bound = (srv.address() as AddressInfo).port;
      srv.close(() => resolve(bound));
    });
  });
}
