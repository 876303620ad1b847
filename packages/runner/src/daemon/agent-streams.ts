import http2 from "node:http2";
import { Socket } from "node:net";
import type { Duplex } from "node:stream";
import { ConnectError, httpStatusOf } from "@sandbar/protocol";
import type { SandboxRuntime } from "../runtime.ts";

// Agent traffic between control and a runner: one full-duplex HTTP/2 stream per agent
// connection on the runner's port (POST, the runner credential, `x-sandbar-sandbox-id`), whose
// bodies both ways are the bytes of a connection to the agent's API socket or its tunnel socket.
// HTTP/2 gives back-pressure per stream and half-close (END_STREAM), so the agent's own HTTP/2 and
// the preview tunnel's raw bytes pass unchanged and streamed.

export const AGENT_API_PATH = "/_sandbar/agent/api";
export const AGENT_TUNNEL_PATH = "/_sandbar/agent/tunnel";
export const SANDBOX_ID_HEADER = "x-sandbar-sandbox-id";
/** Why a stream was refused (the status alone does not say). */
export const ERROR_HEADER = "x-sandbar-error";

/** Serves one agent stream (the caller checked the credential); the path says which socket. */
export async function serveAgentStream(runtime: SandboxRuntime, req: http2.Http2ServerRequest, res: http2.Http2ServerResponse): Promise<void> {
  const refuse = (status: number, message: string) => {
    res.writeHead(status, { [ERROR_HEADER]: encodeURIComponent(message) });
    res.end();
  };
  if (req.method !== "POST") return refuse(405, "agent streams are POST");
  const id = req.headers[SANDBOX_ID_HEADER];
  if (typeof id !== "string" || !id) return refuse(400, `the ${SANDBOX_ID_HEADER} header is required`);
  let upstream: Duplex;
  try {
    const dial = await runtime.connectAgent(id);
    upstream = req.url === AGENT_API_PATH ? dial.api() : dial.tunnel();
  } catch (err) {
    const e = err instanceof ConnectError ? err : undefined;
    // The status is the one code table's (control's client reads only "not 200" and the reason header).
    return refuse(e ? httpStatusOf(e.code) : 500, e?.rawMessage ?? "the runner could not reach the agent");
  }
  const connected = () => {
    if (res.headersSent) return;
    res.writeHead(200);
    req.pipe(upstream);
    upstream.pipe(res);
  };
  upstream.once("error", (err: NodeJS.ErrnoException) => {
    if (!res.headersSent) return refuse(502, `the agent's socket: ${err.code ?? err.message}`);
    res.stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
  });
  res.stream.once("close", () => upstream.destroy());
  if (upstream instanceof Socket && upstream.connecting) upstream.once("connect", connected);
  else connected();
}

/**
 * An agent stream from control's side: the HTTP/2 stream itself, usable at once as a connection
 * (requests written before the runner answers are sent in order). A refusal destroys it with
 * the runner's reason. The socket methods an http.Agent calls on its connections are no-ops.
 */
export function openAgentStream(session: http2.ClientHttp2Session, path: string, sandboxId: string, credential: string): Duplex {
  const stream = session.request({ ":method": "POST", ":path": path, authorization: `Bearer ${credential}`, [SANDBOX_ID_HEADER]: sandboxId }, { endStream: false });
  stream.once("response", (headers) => {
    const status = Number(headers[":status"]);
    if (status === 200) return;
    const reason = headers[ERROR_HEADER];
    const message = typeof reason === "string" ? decodeURIComponent(reason) : `status ${status}`;
    stream.destroy(new Error(`the runner refused the agent stream: ${message}`));
  });
  // When the runner goes away the session destroys every open stream with its error (ECONNRESET);
  // a stream whose user already let go of it (a pooled tunnel, a relay mid-teardown) must not
  // take the process down with an unhandled 'error'. Users that listen still get it.
  stream.on("error", () => undefined);
  for (const m of ["setKeepAlive", "setNoDelay", "ref", "unref"]) if (typeof Reflect.get(stream, m) !== "function") Reflect.set(stream, m, () => stream);
  return stream;
}
