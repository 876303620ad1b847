import { STATUS_CODES, type ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { asConnectError, httpStatusOf } from "@sandbar/protocol";
import { reportUnexpected } from "../call/unexpected.ts";
import { RATE_LIMIT_HEADER } from "../limits/rate-limits.ts";
import { sendJson, statusOverride } from "./http-io.ts";

// The one rendering of errors over HTTP: REST answers, refused WebSocket upgrades, the preview
// proxy and the listener's own refusals all answer the reference's body
// {path, timestamp, statusCode, error, message}, with the status from the one code table.

/** The reference's error body for any failure (`path` is unknown for a request refused before it was parsed). */
export function errorBody(path: string | undefined, err: unknown) {
  const e = asConnectError(err);
  const statusCode = statusOverride(e) ?? httpStatusOf(e.code);
  return { ...(path === undefined ? {} : { path }), timestamp: new Date().toISOString(), statusCode, error: STATUS_CODES[statusCode] ?? "Error", message: e.rawMessage };
}

/** Answers an HTTP request with its error (a stream already answering is cut instead). */
export function sendError(res: ServerResponse, path: string, err: unknown): void {
  reportUnexpected(path, err);
  if (res.headersSent) return void res.destroy();
  const body = errorBody(path, err);
  // An error's rate-limit figures (429's Retry-After, a 401's failed-auth count) are headers; its other metadata stays inside.
  asConnectError(err).metadata.forEach((value, key) => {
    if (RATE_LIMIT_HEADER.test(key)) res.setHeader(key, value);
  });
  sendJson(res, body.statusCode, body);
}

/**
 * A whole HTTP/1.1 error answer for a socket no response object owns (a refused WebSocket
 * upgrade, a request Node refused before parsing it); the connection closes after it.
 */
export function rawErrorAnswer(path: string | undefined, err: unknown): string {
  const body = errorBody(path, err);
  const text = JSON.stringify(body);
  let limits = "";
  asConnectError(err).metadata.forEach((value, key) => {
    if (RATE_LIMIT_HEADER.test(key)) limits += `${key}: ${value}\r\n`;
  });
  return `HTTP/1.1 ${body.statusCode} ${body.error}\r\n${limits}Content-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(text)}\r\nConnection: close\r\n\r\n${text}`;
}

/** Answers a WebSocket upgrade request with an HTTP error (before the handshake, so the status reaches the client). */
export function refuse(socket: Duplex, path: string, err: unknown): void {
  reportUnexpected(path, err);
  if (!socket.destroyed) socket.end(rawErrorAnswer(path, err));
}
