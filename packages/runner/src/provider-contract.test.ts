import { randomInt } from "node:crypto";
import { LinuxProvider } from "./linux/provider.ts";
import { afterAll, beforeAll, describe, inject } from "vitest";
import { dockerdUnavailable, sharedDockerd } from "./docker/testing/dockerd.ts";
import { dockerFixture } from "./docker/testing/fixture.ts";
import { fixture as linuxFixture, sandboxInit } from "./linux/testing/harness.ts";
import type { SandboxProvider } from "./provider.ts";
import { prepareContractRootfs, providerContract, type ProviderFixture } from "./testing/provider-contract.ts";
import { disposeFixture } from "./testing/dispose.ts";

// The provider contract (testing/provider-contract.ts) on every provider this host can run: the
// linux provider, the docker provider on an engine the test setup starts (test/setup/dockerd.ts),
// and the docker provider with gVisor (runsc) when Debian's runsc is installed. Needs root.

const isRoot = process.getuid?.() === 0;

function suite(name: string, make: () => Promise<ProviderFixture>, skip: string | undefined, options: { gvisor?: boolean } = {}): void {
  if (skip) console.log(`provider contract: ${name} skipped: ${skip}`);
  describe.skipIf(skip !== undefined)(`provider contract: ${name}`, () => {
    let f: ProviderFixture | undefined;
    const created = new Set<string>();
    beforeAll(async () => {
      f = await make();
      await prepareContractRootfs(f.rootfs);
    });
    afterAll(() => disposeFixture(f, created));
    providerContract(() => f!, created, options);
  });
}

suite(
  "linux",
  async () => {
    const l = await linuxFixture();
    return { ...l, reopen: () => LinuxProvider.open({ dataDir: l.dataDir, uidBase: 1_650_000_000 + randomInt(60_000) * 1024, uidCount: 1024 }) as Promise<SandboxProvider>, initPid: (id: string) => sandboxInit(l.provider, id) } as ProviderFixture;
  },
  isRoot ? undefined : "needs root",
);

const dockerSkip = dockerdUnavailable();
suite("docker", async () => dockerFixture(await sharedDockerd(inject("dockerdDir"))), dockerSkip);
suite(
  "docker with gVisor",
  async () => {
    const engine = await sharedDockerd(inject("dockerdDir"));
    return dockerFixture(engine, { runtime: "runsc" });
  },
  dockerSkip ?? (isRoot && !(await import("./host/command.ts")).which("runsc") ? "runsc (gVisor) is not installed: apt-get install runsc" : undefined),
  { gvisor: true },
);
