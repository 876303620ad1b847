import { describe, expect, it } from "vitest";
import { SandboxQueue } from "./sandbox-queue.ts";

// The runner's one-call-at-a-time per sandbox: what keeps a dead control process's create from
// racing the destroy and create of the process that takes over.

/** A promise the test resolves when it chooses. */
function gate(): { opened: Promise<void>; open: () => void } {
  let open!: () => void;
  const opened = new Promise<void>((r) => (open = r));
  return { opened, open };
}

describe("SandboxQueue", () => {
  it("runs the calls of one sandbox one after another, in arrival order, and others at once", async () => {
    const q = new SandboxQueue();
    const log: string[] = [];
    const step = (name: string, until: Promise<void> = Promise.resolve()) => async () => {
      log.push(`${name} start`);
      await until;
      log.push(`${name} end`);
      return name;
    };
    const holdCreate = gate();
    const create = q.run("a", step("create a", holdCreate.opened));
    const destroy = q.run("a", step("destroy a"));
    const other = q.run("b", step("create b"));
    // Another sandbox's call runs to its end while a's create is held; a's destroy waits for it.
    expect(await other).toBe("create b");
    expect(log).toEqual(["create a start", "create b start", "create b end"]);
    holdCreate.open();
    expect(await Promise.all([create, destroy])).toEqual(["create a", "destroy a"]);
    expect(log.indexOf("destroy a start")).toBeGreaterThan(log.indexOf("create a end"));
  });

  it("a call that fails does not stop the next; its caller gets the error", async () => {
    const q = new SandboxQueue();
    const failed = q.run("a", async () => {
      await Promise.resolve();
      throw new Error("no room");
    });
    const next = q.run("a", async () => "made");
    await expect(failed).rejects.toThrow("no room");
    expect(await next).toBe("made");
  });
});
