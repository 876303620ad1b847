// The agent's byte tunnel: a second unix socket beside the agent's Connect socket, through which
// control reaches a TCP port on the sandbox's loopback (the sandbox has its own network namespace,
// so the host cannot dial it). Raw bytes, no framing: one short header line each way, then the
// connection is the TCP connection.
//
//   control -> agent:  "SANDBAR-TUNNEL/1 <port> <secret>\n"
//   agent -> control:  "OK\n"  |  "ERR <reason> <message>\n"
//
// The agent answers once it has connected to 127.0.0.1:<port> (or ::1) inside the sandbox, so a
// port nobody listens on is reported before any request byte is sent.

import type { Readable } from "node:stream";

/** The tunnel socket's file name, in the directory of the agent's Connect socket. */
export const TUNNEL_SOCKET_NAME = "tunnel.sock";
export const TUNNEL_MAGIC = "SANDBAR-TUNNEL/1";
/** Longest header line either side accepts (the secret is 64 hex characters). */
export const TUNNEL_MAX_HEADER = 512;

/** Why the agent refused a tunnel. */
export type TunnelRefusal = "auth" | "bad-request" | "refused" | "unreachable";

export interface TunnelRequest {
  port: number;
  secret: string;
}

export function encodeTunnelRequest(r: TunnelRequest): string {
  return `${TUNNEL_MAGIC} ${r.port} ${r.secret}\n`;
}

/** The request of a header line (without its newline), or undefined when it is not one. */
export function parseTunnelRequest(line: string): TunnelRequest | undefined {
  const parts = line.split(" ");
  if (parts.length !== 3 || parts[0] !== TUNNEL_MAGIC) return undefined;
  const port = Number(parts[1]);
  if (!/^[0-9]{1,5}$/.test(parts[1]!) || port < 1 || port > 65535 || parts[2] === "") return undefined;
  return { port, secret: parts[2]! };
}

export function encodeTunnelReply(refusal?: { reason: TunnelRefusal; message: string }): string {
  return refusal ? `ERR ${refusal.reason} ${refusal.message.replace(/[\r\n]+/g, " ")}\n` : "OK\n";
}

/** The agent's answer: undefined for OK, else why it refused. */
export function parseTunnelReply(line: string): { reason: TunnelRefusal | "protocol"; message: string } | undefined {
  if (line === "OK") return undefined;
  const m = /^ERR (auth|bad-request|refused|unreachable) (.*)$/.exec(line);
  return m ? { reason: m[1] as TunnelRefusal, message: m[2]! } : { reason: "protocol", message: `unexpected tunnel reply: ${line.slice(0, 80)}` };
}

/**
 * Reads one header line (without its newline) from a tunnel connection, either side's: what came
 * after it is `rest`, and the socket is left paused there. "too-long": no newline within
 * TUNNEL_MAX_HEADER bytes; "ended": the peer ended or closed first.
 */
export function readTunnelLine(socket: Readable): Promise<{ line: string; rest: Buffer } | "too-long" | "ended"> {
  return new Promise((resolve) => {
    let buffered: Buffer = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
      const nl = buffered.indexOf(10);
      if (nl < 0 && buffered.length <= TUNNEL_MAX_HEADER) return;
      done();
      if (nl < 0 || nl > TUNNEL_MAX_HEADER) return resolve("too-long");
      socket.pause();
      resolve({ line: buffered.subarray(0, nl).toString("latin1"), rest: buffered.subarray(nl + 1) });
    };
    const onEnd = () => {
      done();
      resolve("ended");
    };
    const done = () => {
      socket.off("data", onData);
      socket.off("end", onEnd);
      socket.off("close", onEnd);
    };
    socket.on("data", onData);
    socket.once("end", onEnd);
    socket.once("close", onEnd);
  });
}

/** The tunnel socket beside an agent socket. */
export function tunnelSocketBeside(agentSocket: string): string {
  const slash = agentSocket.lastIndexOf("/");
  return (slash < 0 ? "" : agentSocket.slice(0, slash + 1)) + TUNNEL_SOCKET_NAME;
}
