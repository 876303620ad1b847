import type { IncomingMessage, ServerResponse } from "node:http";
import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";

// The package's reviewed casts: the lint (biome.json, lint/casts.grit) refuses `any`, `as unknown as` and
// `as never` everywhere else. Each entry says why it cannot be typed.

/**
 * An answer's JSON body as the test clients hand it over: tests read the fields they expect of
 * each route, and a declared type per route would repeat the contract's messages in JSON spelling.
 */
export type UntypedJson = any;

/**
 * An HTTP/2 request and response (Node's compatibility API) as the HTTP/1.1 types the REST
 * gateway, the preview proxy, the issuer and the S3 endpoint are written against: one port serves
 * both protocols, and the compatibility objects implement every member those handlers use
 * (headers, url, method, socket, events, writeHead, setHeader, write, end). Node's typings give
 * the two no common type.
 */
export function asHttp1(req: IncomingMessage | Http2ServerRequest, res: ServerResponse | Http2ServerResponse): [IncomingMessage, ServerResponse] {
  return [req as unknown as IncomingMessage, res as unknown as ServerResponse];
}
