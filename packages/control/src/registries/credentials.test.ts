import { randomUUID } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@sandbar/protocol";
import { ImageStore, parseImageRef } from "@sandbar/runner/images";
import { seedImages, startRegistry, type SeededImages, type TestRegistry } from "../../../runner/src/images/testing/registry.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SecretBox } from "../auth/secret-box.ts";
import { execIn } from "../db/exec.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { registryCredentialsFor } from "./credentials.ts";

// registryCredentialsFor against a real server's database, then end to end: a real registry
// (Debian's docker-registry on loopback with basic auth), its credentials saved through the API,
// looked up by the image's host and handed to the runner's ImageStore for a real pull (skopeo).

describe("registry credentials for pulls", () => {
  let t: TestServer;
  let box: SecretBox;
  let org: string;
  const call = (verb: string, p: string, body?: unknown) => api(t.url, t.adminKey, verb, p, body);
  const make = async (url: string, username: string, password: string, name = "r") => {
    const res = await call("POST", "/docker-registry", { name, url, username, password });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    return res.body.id as string;
  };
  const lookup = (host: string) => registryCredentialsFor(t.server.orm, org, host, box);

  beforeAll(async () => {
    t = await startTestServer();
    // The server's own box: no SANDBAR_ENCRYPTION_KEY in tests, so the key kept in the database.
    box = await SecretBox.open(t.server.orm, undefined);
    const id = await make("probe.example.com", "probe", "probe-pw");
    org = ((await t.server.orm.em.getConnection().execute(`select organization_id from docker_registry where id = ?`, [id])) as Array<{ organization_id: string }>)[0]!.organization_id;
    await call("DELETE", `/docker-registry/${id}`);
  });
  afterAll(async () => {
    await t?.stop();
  });

  it("matches the image's registry host, Docker Hub under any of its names, and nothing else", async () => {
    await make("https://index.docker.io/v1/", "hub-user", "hub-pw");
    await make("https://quay.example.com:8443", "quay-user", "quay-pw");
    for (const host of ["docker.io", "index.docker.io", "registry-1.docker.io"]) expect(await lookup(host), host).toEqual({ username: "hub-user", password: "hub-pw" });
    expect(await lookup(parseImageRef("python:3.12-slim").registry)).toEqual({ username: "hub-user", password: "hub-pw" });
    expect(await lookup("quay.example.com:8443")).toEqual({ username: "quay-user", password: "quay-pw" });
    expect(await lookup("QUAY.example.com:8443")).toEqual({ username: "quay-user", password: "quay-pw" });
    expect(await lookup("quay.example.com")).toBeUndefined(); // another port, another registry
    expect(await lookup("ghcr.io")).toBeUndefined();
    // Another organization's registries are not the caller's to use.
    expect(await registryCredentialsFor(t.server.orm, randomUUID(), "docker.io", box)).toBeUndefined();
  });

  it("prefers the default among registries of one host, then the newest; reads inside a transaction too", async () => {
    const older = await make("same.example.com", "older", "older-pw");
    await make("https://same.example.com/", "newer", "newer-pw");
    expect((await lookup("same.example.com"))?.username).toBe("newer");
    expect((await call("POST", `/docker-registry/${older}/set-default`)).status).toBe(200);
    expect((await lookup("same.example.com"))?.username).toBe("older");
    const inTx = await t.server.orm.em.fork().transactional((tx) => registryCredentialsFor(execIn(tx), org, "same.example.com", box));
    expect(inTx).toEqual({ username: "older", password: "older-pw" });
    // An update of the password is what the next pull presents.
    await call("PATCH", `/docker-registry/${older}`, { name: "r", url: "same.example.com", username: "older", password: "rotated-pw" });
    expect((await lookup("same.example.com"))?.password).toBe("rotated-pw");
  });

  it("says which registry to fix when its password was sealed under another key", async () => {
    await make("sealed.example.com", "u", "sealed-pw", "sealed-one");
    const otherBox = await SecretBox.open(t.server.orm, "another-encryption-key");
    const err = await registryCredentialsFor(t.server.orm, org, "sealed.example.com", otherBox).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.FailedPrecondition);
    expect((err as ConnectError).rawMessage).toMatch(/^The password of registry sealed-one cannot be decrypted/);
    expect((err as ConnectError).rawMessage).not.toContain("sealed-pw");
  });

  describe("pulling from a private registry", () => {
    let reg: TestRegistry;
    let seeded: SeededImages;
    let scratch: string;

    beforeAll(async () => {
      reg = await startRegistry({ auth: "basic" });
      scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-registry-creds-"));
      seeded = await seedImages(reg, scratch);
    }, 60_000);
    afterAll(async () => {
      await reg?.stop();
      if (scratch) await rm(scratch, { recursive: true, force: true });
    });

    const pullFresh = async (credentials: { username: string; password: string } | undefined) => {
      const store = await ImageStore.open({ dataDir: await mkdtemp(path.join(scratch, "store-")) });
      return store.pull(seeded.app, credentials ? { credentials } : {});
    };

    it("pulls with the credentials saved through the API, and fails with a wrong password", async () => {
      const host = parseImageRef(seeded.app).registry;
      expect(host).toBe(reg.host);
      // Without a saved registry the pull goes anonymous and the registry refuses it.
      expect(await lookup(host)).toBeUndefined();
      const anonymous = await pullFresh(undefined).catch((e: unknown) => e);
      expect((anonymous as ConnectError).code).toBe(Code.PermissionDenied);

      const id = await make(`http://${reg.host}`, reg.username, reg.password, "loopback");
      const creds = await lookup(host);
      expect(creds).toEqual({ username: reg.username, password: reg.password });
      const image = await pullFresh(creds);
      expect(await readFile(path.join(image.rootfs, "app/hello.txt"), "utf8")).toBe("hello from the image\n");
      expect(image.digest).toBe(seeded.appDigest);
      expect(image.config.env).toMatchObject({ GREETING: "hello world" });

      // The wrong password, saved through the API, is what the lookup answers and the registry refuses.
      const patched = await call("PATCH", `/docker-registry/${id}`, { name: "loopback", url: `http://${reg.host}`, username: reg.username, password: "not-the-password" });
      expect(patched.status).toBe(200);
      const wrong = await lookup(host);
      expect(wrong).toEqual({ username: reg.username, password: "not-the-password" });
      const refused = await pullFresh(wrong).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(ConnectError);
      expect((refused as ConnectError).code).toBe(Code.PermissionDenied);
      expect((refused as ConnectError).rawMessage).not.toContain("not-the-password");
    }, 120_000);
  });
});
