import { describe, expect, it } from "vitest";
import { SandboxQueue } from "./sandbox-queue.ts";

// The runner's one-call-at-a-time per sandbox: what keeps a dead control process's create from
// racing the destroy and create of the process that takes over.

const tick = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("SandboxQueue", () => {
  it("runs the calls of one sandbox one after another, in arrival order, and others at once", async () => {
    const q = new SandboxQueue();
    const log: string[] = [];
    const step = (name: string, ms: number) => async () => {
      log.push(`${name} start`);
      await tick(ms);
      log.push(`${name} end`);
      return name;
    };
    const create = q.run("a", step("create a", 40));
    const destroy = q.run("a", step("destroy a", 1));
    const other = q.run("b", step("create b", 1));
    expect(await Promise.all([create, destroy, other])).toEqual(["create a", "destroy a", "create b"]);
    expect(log.indexOf("destroy a start")).toBeGreaterThan(log.indexOf("create a end"));
    expect(log.indexOf("create b end")).toBeLessThan(log.indexOf("create a end"));
  });

  it("a call that fails does not stop the next; its caller gets the error", async () => {
    const q = new SandboxQueue();
    const failed = q.run("a", async () => {
      await tick(5);
      throw new Error("no room");
    });
    const next = q.run("a", async () => "made");
    await expect(failed).rejects.toThrow("no room");
    expect(await next).toBe("made");
  });
});
