import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code, ConnectError } from "@sandbar/protocol";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { Credentials } from "./credentials.ts";

// The revocation barrier, on its own: a second Credentials on the server's database stands for
// another control replica. A key it has cached, deleted through the server, must be refused by it
// on the very next call: the barrier's round trip on its listening connection (an empty query)
// is answered only after the revocation's notification, which evicts the key.

let server: TestServer;
let replica: Credentials;

beforeAll(async () => {
  server = await startTestServer();
  replica = new Credentials(server.server.databaseUrl);
  await replica.start(server.server.databaseUrl);
});

afterAll(async () => {
  await replica?.stop();
  await server?.stop();
});

describe("Credentials' revocation barrier", () => {
  it("refuses a cached key on the call right after its deletion elsewhere, every time", async () => {
    for (let i = 0; i < 15; i++) {
      const created = await api(server.url, server.adminKey, "POST", "/api-keys", { name: `k${i}`, permissions: [] });
      expect(created.status).toBe(201);
      const bearer = `Bearer ${created.body.value}`;
      // Cached by the replica (twice: the second is a hit).
      expect((await replica.authenticate(bearer)).apiKey?.name).toBe(`k${i}`);
      expect((await replica.authenticate(bearer)).apiKey?.name).toBe(`k${i}`);
      expect((await api(server.url, server.adminKey, "DELETE", `/api-keys/k${i}`)).status).toBe(204);
      const err = await replica.authenticate(bearer).then(() => undefined, (e: unknown) => e);
      expect(err, `round ${i}`).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(Code.Unauthenticated);
    }
  });

  it("lets concurrent calls share a round trip and still answer each", async () => {
    const bearer = `Bearer ${server.adminKey}`;
    const all = await Promise.all(Array.from({ length: 20 }, () => replica.authenticate(bearer)));
    expect(all.every((p) => p.kind === "api-key")).toBe(true);
  });
});
