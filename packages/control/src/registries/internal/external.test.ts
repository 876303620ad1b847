import { spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { addImage, initLayout, layerFromFiles } from "../../../../runner/src/images/testing/registry.ts";
import { freePort } from "@sandbar/runner/free-port";
import { issuerSettings, TestIssuer } from "../../testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../../testing/server.ts";
import { type RegistryProcess, startRegistryProcess } from "./registry-process.ts";
import type { UntypedJson } from "../../casts.ts";

// SANDBAR_PUSH_REGISTRY: the server runs no registry, only the token service, at a fixed address;
// an operator's registry (here a docker-registry this test starts, as an operator would, with the
// realm, service, issuer and certificate the server names) accepts the server's short-lived accounts.

interface Access {
  username: string;
  secret: string;
  registryUrl: string;
  project: string;
}

let t: TestServer;
let registry: RegistryProcess;
let scratch: string;
let layout: string;
let registryHost: string;
const idp = new TestIssuer();
const lines: string[] = [];

function skopeo(a: Access, args: string[]): Promise<{ code: number; stderr: string }> {
  const authfile = path.join(scratch, `auth-${Math.random().toString(36).slice(2)}.json`);
  return writeFile(authfile, JSON.stringify({ auths: { [a.registryUrl]: { auth: Buffer.from(`${a.username}:${a.secret}`).toString("base64") } } }), { mode: 0o600 }).then(
    () =>
      new Promise((resolve, reject) => {
        const child = spawn("skopeo", [args[0]!, "--authfile", authfile, ...args.slice(1)], { stdio: ["ignore", "ignore", "pipe"], env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: scratch } });
        let stderr = "";
        child.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
        child.on("error", reject);
        child.on("close", (code) => resolve({ code: code ?? -1, stderr }));
      }),
  );
}

beforeAll(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-push-external-"));
  layout = path.join(scratch, "layout");
  await initLayout(layout);
  await addImage(layout, "app", { layers: [await layerFromFiles({ "etc/hello": "from the external registry\n" }, scratch)] });
  await idp.start();
  await idp.addKey("k");
  registryHost = `127.0.0.1:${await freePort()}`;
  const tokenPort = await freePort();
  t = await startTestServer({
    settings: { ...issuerSettings(idp), internalRegistry: { enabled: true, external: registryHost, tokenService: { host: "127.0.0.1", port: tokenPort } } },
  });
  // The operator's registry, configured as the server's log says.
  registry = await startRegistryProcess({
    dir: path.join(scratch, "operator-registry"),
    address: registryHost,
    realm: `http://127.0.0.1:${tokenPort}/token`,
    certPath: path.join(t.dataDir, "registry", "token.crt"),
    log: (l) => lines.push(l),
  });
}, 120_000);

afterAll(async () => {
  await registry?.stop();
  await t?.stop();
  idp.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

describe("an external push registry", () => {
  it("hands out accounts for it that push in the organization's namespace only, and snapshots pull from it", async () => {
    const mine = (await api(t.url, t.adminKey, "GET", "/docker-registry/registry-push-access")).body as Access;
    expect(mine.registryUrl).toBe(registryHost);
    const pushed = await skopeo(mine, ["copy", "--quiet", "--dest-tls-verify=false", `oci:${layout}:app`, `docker://${registryHost}/${mine.project}/app:1.0`]);
    expect(pushed.code, pushed.stderr).toBe(0);

    const other = await idp.sign("k", { sub: "orla", email: "orla@example.test", name: "orla" });
    const otherOrg = (await api(t.url, other, "GET", "/organizations")).body[0].id;
    const theirs = (await api(t.url, other, "GET", "/docker-registry/registry-push-access", undefined, { "x-sandbar-organization-id": otherOrg })).body as Access;
    const stolen = await skopeo(theirs, ["inspect", "--raw", "--tls-verify=false", `docker://${registryHost}/${mine.project}/app:1.0`]);
    expect(stolen.code).not.toBe(0);
    expect(stolen.stderr).toMatch(/denied|unauthorized|authentication required/i);

    const snap = await api(t.url, t.adminKey, "POST", "/snapshots", { name: "from-external", imageName: `${registryHost}/${mine.project}/app:1.0` });
    expect(snap.status, JSON.stringify(snap.body)).toBe(200);
    const until = Date.now() + 60_000;
    let state: UntypedJson;
    do {
      await new Promise((r) => setTimeout(r, 100));
      state = (await api(t.url, t.adminKey, "GET", `/snapshots/${snap.body.id}`)).body;
    } while (!["active", "error"].includes(state.state) && Date.now() < until);
    expect(state.errorReason ?? null).toBeNull();
    expect(state.state).toBe("active");
  }, 120_000);
});
