import { isIPv4 } from "node:net";
import { V2_SIGNATURE } from "../proxy-protocol.ts";

/** PROXY headers as a load balancer writes them, for tests (haproxy's own are tested in test/fleet). */

export function proxyV1(source: string, sourcePort: number, destination = isIPv4(source) ? "127.0.0.1" : "::1", destinationPort = 3000): Buffer {
  return Buffer.from(`PROXY ${isIPv4(source) ? "TCP4" : "TCP6"} ${source} ${destination} ${sourcePort} ${destinationPort}\r\n`, "latin1");
}

/** A v2 PROXY (or LOCAL) header; `tlvs` are appended to the address block as they are. */
export function proxyV2(source: string, sourcePort: number, opts: { local?: boolean; tlvs?: Buffer } = {}): Buffer {
  const v4 = isIPv4(source);
  const addr = (a: string) => (v4 ? Buffer.from(a.split(".").map(Number)) : ipv6Bytes(a));
  const ports = Buffer.alloc(4);
  ports.writeUInt16BE(sourcePort, 0);
  ports.writeUInt16BE(3000, 2);
  const block = Buffer.concat([addr(source), addr(v4 ? "127.0.0.1" : "::1"), ports, opts.tlvs ?? Buffer.alloc(0)]);
  const head = Buffer.alloc(4);
  head[0] = opts.local ? 0x20 : 0x21;
  head[1] = v4 ? 0x11 : 0x21;
  head.writeUInt16BE(block.length, 2);
  return Buffer.concat([V2_SIGNATURE, head, block]);
}

function ipv6Bytes(text: string): Buffer {
  const [left, right] = text.includes("::") ? text.split("::") : [text, undefined];
  const groups = (s: string | undefined) => (s ? s.split(":") : []);
  const l = groups(left);
  const r = groups(right);
  const all = right === undefined ? l : [...l, ...Array(8 - l.length - r.length).fill("0"), ...r];
  const out = Buffer.alloc(16);
  all.forEach((g, i) => out.writeUInt16BE(parseInt(g, 16), 2 * i));
  return out;
}
