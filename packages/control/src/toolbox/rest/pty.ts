import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { CreatePtyRequestSchema, PtyService } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import type { WebSocket } from "ws";
import type { ToolboxCaller } from "./call.ts";
import { setField } from "../../gateway/json.ts";
import { DecodeErrors, readJsonMessage, sendJson } from "./http.ts";
import type { RestHandler } from "./routes.ts";
import { closeWith, messageOf, sendFrame } from "./ws-frames.ts";

/** `POST …/process/pty` → 201 `{sessionId}`, as the reference answers. */
export const createPty: RestHandler = async ({ req, res, caller }) => {
  const errs = new DecodeErrors();
  const input = await readJsonMessage(req, CreatePtyRequestSchema, errs);
  const out = await caller.unary(PtyService.method.createPty, input, errs.messages);
  sendJson(res, 201, { sessionId: out.sessionId });
};

/** Offered by clients (SDK 0.2xx) that want the exit as a control frame before the close. */
export const PTY_EXIT_CONTROL = "X-Daytona-Pty-Exit-Control";
/** Newer SDKs pass a terminal's envs on create-connect as this subprotocol: base64url of the JSON object. */
const PTY_ENVS = "X-Daytona-Pty-Envs~";

/**
 * `…/process/pty/{id}/connect` over WebSocket, the reference's protocol: a text control frame
 * `{"type":"control","status":"connected"}`, then binary output frames; every client frame is
 * input; at the exit (after a control frame `{"status":"exited",exitCode,exitReason?}` for
 * clients that offered PTY_EXIT_CONTROL) a close frame, 1000 `{"exitCode":0}` or 1011
 * `{"exitCode":N,"exitReason":…}`. A failure before the connection is up is a control frame
 * with status "error".
 */
export async function servePty(ws: WebSocket, caller: ToolboxCaller, sessionId: string, exitControl: boolean): Promise<void> {
  // Input goes to the terminal in the order it came.
  let input = Promise.resolve();
  ws.on("message", (data: Buffer | ArrayBuffer | Buffer[]) => {
    const bytes = Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data as ArrayBuffer);
    input = input.then(() => caller.unary(PtyService.method.sendPtyInput, { sessionId, data: bytes })).then(
      () => undefined,
      () => undefined, // The terminal is gone: its exit (or the error) is reported on the output side.
    );
  });
  let connected = false;
  try {
    for await (const ev of caller.serverStream(PtyService.method.connectPty, { sessionId })) {
      const e = ev.event;
      if (e.case === "connected") {
        connected = true;
        await sendFrame(ws, JSON.stringify({ type: "control", status: "connected" }));
      } else if (e.case === "data") {
        await sendFrame(ws, e.value);
      } else if (e.case === "exit") {
        const { exitCode, exitReason } = e.value;
        const reason = exitCode === 0 ? undefined : exitReason || "non-zero exit";
        if (exitControl) await sendFrame(ws, JSON.stringify({ type: "control", status: "exited", exitCode, ...(reason ? { exitReason: reason } : {}) })).catch(() => undefined);
        return exitCode === 0 ? closeWith(ws, 1000, JSON.stringify({ exitCode })) : closeWith(ws, 1011, JSON.stringify({ exitCode, exitReason: reason }));
      }
    }
    closeWith(ws, 1000, "");
  } catch (err) {
    const message = messageOf(err);
    if (connected) return closeWith(ws, 1011, message);
    await sendFrame(ws, JSON.stringify({ type: "control", status: "error", error: `Failed to connect to PTY session: ${message}` })).catch(() => undefined);
    ws.terminate();
  }
}

/**
 * `…/process/pty/create-connect?id=&cols=&rows=&cwd=` (SDK 0.2xx): creates a lazily started
 * terminal, envs from the PTY_ENVS subprotocol, then connects to it in the same round trip.
 * Numbers are decoded as the gateway decodes a query (a uint32 out of range is a problem, not a
 * failure to encode); problems are raised after the caller is checked.
 */
export function createConnectRequest(query: URLSearchParams, offered: string[]): { input: MessageInitShape<typeof CreatePtyRequestSchema>; problems: string[] } {
  const errs = new DecodeErrors();
  const input = create(CreatePtyRequestSchema, { id: query.get("id") ?? "", cwd: query.get("cwd") || undefined, lazyStart: true });
  for (const name of ["cols", "rows"] as const) {
    const text = query.get(name);
    if (text !== null && text !== "") setField(input, CreatePtyRequestSchema.field[name], text, "text", errs);
  }
  const token = offered.find((p) => p.startsWith(PTY_ENVS));
  if (token) {
    let envs: unknown;
    try {
      envs = JSON.parse(Buffer.from(token.slice(PTY_ENVS.length), "base64url").toString("utf8"));
    } catch {
      errs.add("the PTY envs subprotocol is not base64url JSON");
    }
    if (typeof envs !== "object" || envs === null || Array.isArray(envs) || Object.values(envs).some((v) => typeof v !== "string")) {
      if (!errs.messages.length) errs.add("the PTY envs must be an object of strings");
    } else input.envs = envs as Record<string, string>;
  }
  return { input, problems: errs.messages };
}
