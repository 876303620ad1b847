import { rm } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import { DockerProvider } from "@sandbar/runner/docker";
import { dockerdUnavailable, sharedDockerd } from "@sandbar/runner/testing/dockerd";
import { loadSettings } from "../settings.ts";
import { buildAgentBundle } from "../testing/agent-bundle.ts";
import type { SandboxProvider } from "@sandbar/runner";
import { sandboxFixture, type SandboxFixture } from "./testing/fixtures.ts";

// SANDBAR_PROVIDER=docker end to end: a server whose sandboxes are containers of a Docker engine
// the test setup starts (test/setup/dockerd.ts), running the real agent from the default
// snapshot; created, used through the toolbox, stopped, started and deleted through the API.

it("SANDBAR_PROVIDER is linux by default, docker on request with its socket and runtime; anything else refused at start", () => {
  expect(loadSettings({}).sandboxProvider).toEqual({ kind: "linux" });
  expect(loadSettings({ SANDBAR_PROVIDER: "Docker", SANDBAR_DOCKER_SOCKET: "/run/docker.sock", SANDBAR_DOCKER_RUNTIME: "runsc" }).sandboxProvider).toEqual({ kind: "docker", dockerSocket: "/run/docker.sock", dockerRuntime: "runsc" });
  expect(() => loadSettings({ SANDBAR_PROVIDER: "podman" })).toThrow('SANDBAR_PROVIDER must be linux or docker, got "podman"');
  expect(() => loadSettings({ SANDBAR_PROVIDER: "docker", SANDBAR_DOCKER_SOCKET: "tcp://x:2375" })).toThrow("SANDBAR_DOCKER_SOCKET must be an absolute path");
  expect(() => loadSettings({ SANDBAR_PROVIDER: "docker", SANDBAR_DOCKER_RUNTIME: "run sc;" })).toThrow("SANDBAR_DOCKER_RUNTIME must be a runtime name");
});

const skip = dockerdUnavailable();
if (skip) console.log(`docker provider end to end skipped: ${skip}`);

describe.skipIf(skip !== undefined)("sandboxes on the docker provider", () => {
  let bundle: string;
  let f: SandboxFixture;

  beforeAll(async () => {
    const engine = await sharedDockerd(inject("dockerdDir"));
    bundle = await buildAgentBundle();
    f = await sandboxFixture({ agentBundle: bundle, warmPool: 0, sandboxProvider: { kind: "docker", dockerSocket: engine.socketPath } });
  }, 300_000);

  afterAll(async () => {
    await f?.stop();
    if (bundle) await rm(bundle, { recursive: true, force: true });
  });

  it("creates a sandbox through the API and runs commands in it through the toolbox", async () => {
    const provider: SandboxProvider = f.runtime.provider;
    if (!(provider instanceof DockerProvider)) throw new Error(`SANDBAR_PROVIDER=docker made a ${provider.name} provider`);
    const s = await f.create({ env: { PROJECT: "sandbar" } });
    expect(s.state).toBe("started");
    const execute = (command: string) => f.call("POST", `/toolbox/${s.id}/toolbox/process/execute`, { command });
    const first = await execute('echo "$PROJECT" > ~/kept && cat ~/kept && id -un && . /etc/os-release && echo "$VERSION_CODENAME"');
    expect(first.status, JSON.stringify(first.body)).toBe(200);
    expect(first.body).toEqual({ exitCode: 0, result: "sandbar\nsandbar\nbookworm\n" });
    // The sandbox is a container of the engine, named after the runner and the sandbox.
    const c = await provider.docker.getContainer(provider.containerName(s.id)).inspect();
    expect(c.State.Running).toBe(true);
    expect(c.HostConfig.NetworkMode).toBe("none");

    await f.call("POST", `/sandbox/${s.id}/stop`);
    expect((await provider.docker.getContainer(provider.containerName(s.id)).inspect()).State.Running).toBe(false);
    expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");
    expect((await execute("cat ~/kept")).body).toEqual({ exitCode: 0, result: "sandbar\n" });

    // Archive packs the container's writable layer and removes the container; start restores it into a new one.
    await f.call("POST", `/sandbox/${s.id}/stop`);
    expect((await f.call("POST", `/sandbox/${s.id}/archive`)).body.state).toBe("archived");
    expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");
    expect((await execute("cat ~/kept; id -un")).body).toEqual({ exitCode: 0, result: "sandbar\nsandbar\n" });

    expect((await f.call("DELETE", `/sandbox/${s.id}`)).body.state).toBe("destroyed");
    await expect(provider.docker.getContainer(provider.containerName(s.id)).inspect()).rejects.toMatchObject({ statusCode: 404 });
  });
});
