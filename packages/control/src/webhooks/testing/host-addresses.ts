import { isIP } from "node:net";
import { networkInterfaces } from "node:os";

/**
 * This host's interface addresses but loopback and link-local (those need a zone to be a URL's
 * host, and fe80::/10 is refused by range), as a test reads them: eth0, bridges, veths.
 */
export function hostAddresses(): string[] {
  return Object.values(networkInterfaces())
    .flat()
    .filter((i) => i && !i.internal && !i.address.toLowerCase().startsWith("fe80:"))
    .map((i) => i!.address);
}

/** The address as a URL's host. */
export const inUrl = (a: string) => (isIP(a) === 6 ? `[${a}]` : a);

/** The address as a literal part of a RegExp. */
export const literally = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
