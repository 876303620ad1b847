import net from "node:net";
import type { AddressInfo } from "node:net";
import readline from "node:readline";
import { fromJson, type DescMethod, type JsonValue, toJson } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ApiKeyService } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { contextFor, newCall } from "./call.ts";
import type { CallChain } from "./chain.ts";

/**
 * A toy way in, to show what a new entry point (an SSH gateway, an MCP endpoint, another vendor's
 * dialect) is: an adapter that turns its requests into Calls and invokes methods through the
 * chain. This one speaks one JSON object per line over TCP: {method, token, input} in, {output}
 * or {code, message} out. Everything else (authentication, scopes, rate limits, audit, input
 * checks) is the chain's.
 */
function lineAdapter(chain: CallChain, methods: readonly DescMethod[]): net.Server {
  const byName = new Map(methods.map((m) => [`${m.parent.typeName}/${m.name}`, m]));
  return net.createServer((socket) => {
    socket.on("error", () => socket.destroy());
    readline.createInterface({ input: socket }).on("line", async (line) => {
      const answer = (value: object) => socket.write(JSON.stringify(value) + "\n");
      try {
        const { method: name, token, input } = JSON.parse(line) as { method: string; token?: string; input?: JsonValue };
        const method = byName.get(name);
        if (!method) throw new ConnectError(`no method ${name}`, Code.NotFound);
        const call = newCall({ headers: token ? { authorization: `Bearer ${token}` } : {}, socket });
        const output = await chain.unary(contextFor(call, method, AbortSignal.timeout(30_000), [], "line"), fromJson(method.input, input ?? {}));
        answer({ output: toJson(method.output, output) });
      } catch (err) {
        const e = ConnectError.from(err);
        answer({ code: Code[e.code], message: e.rawMessage });
      }
    });
  });
}

let t: TestServer;
let toy: net.Server;
let ask: (request: object) => Promise<{ output?: Record<string, unknown>; code?: string; message?: string }>;

beforeAll(async () => {
  t = await startTestServer();
  toy = lineAdapter(t.server.chain, ApiKeyService.methods);
  await new Promise<void>((resolve) => toy.listen(0, "127.0.0.1", resolve));
  const socket = net.connect((toy.address() as AddressInfo).port, "127.0.0.1");
  const lines = readline.createInterface({ input: socket })[Symbol.asyncIterator]();
  ask = async (request) => {
    socket.write(JSON.stringify(request) + "\n");
    return JSON.parse((await lines.next()).value as string);
  };
});

afterAll(async () => {
  toy?.close();
  await t?.stop();
});

const create = (token: string | undefined, input: object) => ask({ method: "sandbar.control.v1.ApiKeyService/CreateApiKey", token, input });

describe("a new way in is an adapter of the call chain", () => {
  it("gets authentication, scopes and input checks from the chain", async () => {
    expect(await create(undefined, { name: "toy" })).toMatchObject({ code: "Unauthenticated" });
    expect(await create("sbr_" + "0".repeat(64), { name: "toy" })).toMatchObject({ code: "Unauthenticated" });
    const narrow = await api(t.url, t.adminKey, "POST", "/api-keys", { name: "narrow", permissions: ["read:volumes"] });
    expect(narrow.status).toBe(201);
    expect(await create(narrow.body.value as string, { name: "toy", permissions: ["PERMISSION_WRITE_SANDBOXES"] })).toMatchObject({ code: "PermissionDenied" });
    expect(await create(t.adminKey, { name: "bad\u0000name" })).toMatchObject({ code: "InvalidArgument" });
    const made = await create(t.adminKey, { name: "toy-key", permissions: ["PERMISSION_READ_VOLUMES"] });
    expect(made.output).toMatchObject({ name: "toy-key" });
  });

  it("is audited like every other way in, under its own protocol name", async () => {
    await create(t.adminKey, { name: "toy-audited", permissions: ["PERMISSION_READ_VOLUMES"] });
    const rows = await t.server.orm.em.getConnection().execute<{ action: string; status_code: number; protocol: string }[]>(
      `select action, status_code, metadata->>'protocol' as protocol from audit_log where target_id = 'toy-audited'`,
    );
    expect(rows).toEqual([{ action: "create", status_code: 201, protocol: "line" }]);
  });
});
