import type { IncomingHttpHeaders } from "node:http";
import { CreateSessionRequestSchema, ProcessService, SessionExecuteRequestSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import type { ToolboxCaller } from "./call.ts";
import { DecodeErrors, readJsonMessage, sendEmpty, sendJson, write } from "./http.ts";
import { LogLines, referenceOutput } from "./log-lines.ts";
import type { RestHandler } from "./routes.ts";
import { outputMode } from "./sdk-version.ts";

/** `POST …/process/session {sessionId}` → 201, as the reference answers. */
export const createSession: RestHandler = async ({ req, res, caller }) => {
  const errs = new DecodeErrors();
  const input = await readJsonMessage(req, CreateSessionRequestSchema, errs);
  await caller.unary(ProcessService.method.createSession, input, errs.messages);
  sendEmpty(res, 201);
};

/**
 * `POST …/process/session/{id}/exec`. Synchronous: 200 `{cmdId, output, stdout, stderr, exitCode}`
 * where `output` is the marked log (markers stripped for clients that want combined text) and
 * stdout/stderr are filled only for SDKs that expect the server to split them (0.167 on).
 * Asynchronous (`runAsync`, or the legacy `async`): 202 with the command id and nulls.
 */
export const sessionExec: RestHandler = async ({ req, res, caller, params }) => {
  const errs = new DecodeErrors();
  const input = await readJsonMessage(req, SessionExecuteRequestSchema, errs);
  input.sessionId = params.session_id;
  const out = await caller.unary(ProcessService.method.sessionExecute, input, errs.messages);
  if (input.runAsync || input.async) return sendJson(res, 202, { cmdId: out.cmdId, output: null, stdout: null, stderr: null, exitCode: null });
  const mode = outputMode(req.headers);
  const { output, stdout, stderr } = referenceOutput(out.chunks, !mode.combined);
  sendJson(res, 200, {
    cmdId: out.cmdId,
    output,
    stdout: mode.serverDemux ? stdout : null,
    stderr: mode.serverDemux ? stderr : null,
    exitCode: out.exitCode ?? null,
  });
};

/**
 * `GET …/process/session/{id}/command/{cid}/logs`: SDKs from 0.167 get JSON `{output, stdout,
 * stderr}`; others the log as text, markers kept or stripped by their version. With
 * `follow=true` the text is a chunked stream that ends once the command has exited and its
 * output is drained (the WebSocket form is in websocket.ts).
 */
export const commandLogs: RestHandler = async ({ req, res, caller, params, query }) => {
  const follow = query.get("follow") === "true";
  const mode = outputMode(req.headers);
  const ids = { sessionId: params.session_id, commandId: params.command_id };
  if (mode.serverDemux && !follow) {
    const logs = await caller.unary(ProcessService.method.getSessionCommandLogs, ids);
    return sendJson(res, 200, referenceOutput(logs.chunks, true));
  }
  // The command must exist (and the caller may see it) before the status is committed.
  await caller.unary(ProcessService.method.getSessionCommand, ids);
  res.writeHead(200, { "content-type": follow ? "application/octet-stream" : "text/plain; charset=utf-8", "x-content-type-options": "nosniff" });
  if (follow) res.flushHeaders();
  for await (const chunk of logChunks(caller, ids, follow, req.headers)) await write(res, chunk);
  res.end();
};

/** A command's log as the reference's bytes for this client: line by line, marked or not. */
export async function* logChunks(caller: ToolboxCaller, ids: { sessionId: string; commandId: string }, follow: boolean, headers: IncomingHttpHeaders): AsyncGenerator<Buffer> {
  const lines = new LogLines(!outputMode(headers).combined);
  for await (const chunk of caller.serverStream(ProcessService.method.streamSessionCommandLogs, { ...ids, follow })) {
    const out = chunk.data.case === "stdout" ? lines.push("stdout", chunk.data.value) : chunk.data.case === "stderr" ? lines.push("stderr", chunk.data.value) : undefined;
    if (out?.length) yield out;
  }
  const tail = lines.end();
  if (tail.length) yield tail;
}
