import { beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { eventually, type SandboxFixture } from "../sandboxes/testing/fixtures.ts";
import { APP_PORT, hostOf, pathOf, previewSuite, root, sandbox, send } from "./testing/suite.ts";

// A preview request or WebSocket to a paused sandbox resumes it and is answered (the caller
// waits, no error); requests that arrive together share one resume (the server and app in
// testing/suite.ts: the real agent and a python app).

const suite = previewSuite();
let f: SandboxFixture;
let port: number;
beforeAll(() => void ({ f, port } = suite.get()));

const stateOf = async (id: string) => (await f.call("GET", `/sandbox/${id}`)).body.state as string;

async function pause(id: string): Promise<void> {
  const res = await f.call("POST", `/sandbox/${id}/pause`);
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  expect(res.body.state).toBe("paused");
}

describe.skipIf(!root)("the preview proxy and a paused sandbox", () => {
  let priv: { id: string; token: string };
  beforeAll(async () => {
    priv = await sandbox({ autoStopInterval: 0 });
  }, 120_000);

  it("requests of both forms to a paused sandbox resume it and are answered", async () => {
    const headers = { "x-sandbar-preview-token": priv.token };
    expect((await send("/info", { host: hostOf(priv.id), headers })).status).toBe(200); // its endpoint is in the proxy's cache now
    await pause(priv.id);
    const [byHost, byPath] = await Promise.all([send("/info", { host: hostOf(priv.id), headers }), send(pathOf(priv.id), { headers })]);
    expect(byHost.status, byHost.text).toBe(200);
    expect(byPath.status, byPath.text).toBe(200);
    expect(await stateOf(priv.id)).toBe("started");
    expect((await f.runtime.provider.inspect(priv.id)).state).toBe("started");
  });

  it("a WebSocket to a paused sandbox resumes it and echoes", async () => {
    await pause(priv.id);
    const ws = new WebSocket(`ws://127.0.0.1:${port}${pathOf(priv.id, APP_PORT, "/ws")}`, { headers: { "x-daytona-preview-token": priv.token } });
    await new Promise((ok, fail) => (ws.once("open", ok), ws.once("error", fail)));
    const got: string[] = [];
    ws.on("message", (m) => got.push(m.toString()));
    ws.send("after the pause");
    await eventually("the echo", async () => got.length === 1);
    expect(got[0]).toBe("after the pause");
    ws.close();
    expect(await stateOf(priv.id)).toBe("started");
  });
});
