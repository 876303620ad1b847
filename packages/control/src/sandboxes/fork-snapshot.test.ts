import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MAX_LAYERS } from "@sandbar/runner";
import { sweepLayers } from "./layer-capture.ts";
import { reconcile } from "./reconcile.ts";
import { eventually, type SandboxDto, type SandboxFixture, sandboxFixture } from "./testing/fixtures.ts";

// POST /sandbox/{id}/snapshot and /fork (and /forks, Sandbar's N forks sharing one capture) with
// real sandboxes: files, a package-like tree and deletions carried, processes not; the parent runs
// on; parent and forks apart after the capture; stacks of forks up to the depth bound and past it;
// lineage; layers kept while used; the reference's refusals.

let f: SandboxFixture;

beforeAll(async () => {
  f = await sandboxFixture();
}, 120_000);

afterAll(async () => {
  await f?.stop();
});

const sh = async (id: string, command: string) => {
  const r = await f.exec(id, command);
  expect(r.exitCode, r.result).toBe(0);
  return r.result;
};
/** A package-like tree where python3 of the default snapshot finds modules (`pip install --user`'s). */
const PKG = "~/.local/lib/python3.11/site-packages/widget";
const post = (path: string, body: unknown = {}, key?: string) => f.call("POST", path, body, key);

describe("snapshot of a running sandbox", () => {
  let parent: SandboxDto;

  it("refuses bad input as the reference does", async () => {
    parent = await f.create();
    const cases: Array<[unknown, number, RegExp]> = [
      [{ name: "" }, 400, /name/],
      [{ name: "bad name!" }, 400, /^Invalid snapshot name format/],
      [{ name: "mem", includeMemory: true }, 400, /^Container sandboxes do not support memory snapshots$/],
    ];
    for (const [body, status, message] of cases) {
      const r = await post(`/sandbox/${parent.id}/snapshot`, body);
      expect(r.status, JSON.stringify(body)).toBe(status);
      expect(r.body.message).toMatch(message);
    }
    const other = await f.otherOrganization();
    expect((await post(`/sandbox/${parent.id}/snapshot`, { name: "theirs" }, other.key)).status).toBe(404);
    expect((await post(`/sandbox/${parent.id}/fork`, {}, other.key)).status).toBe(404);
    expect((await f.call("GET", `/sandbox/${parent.id}/forks`, undefined, other.key)).status).toBe(404);
  });

  it("a sandbox made from the snapshot has the files and the package tree, not the processes; the parent runs and writes on", async () => {
    await sh(parent.id, [
      "echo hello > ~/note.txt",
      `mkdir -p ${PKG} && printf 'def make():\\n    return 42\\n' > ${PKG}/__init__.py`,
          ].join(" && "));
    await sh(parent.id, "printf 'while true; do date +%%s%%N >> ~/ticks; sleep 0.05; done\\n' > ~/ticker.sh && sh /home/sandbar/ticker.sh >/dev/null 2>&1 </dev/null & echo started");
    await eventually("the ticker runs", async () => (await f.exec(parent.id, "pgrep -fc '^sh /home/sandbar/ticker'")).result.trim() === "1", 10_000);
    const r = await post(`/sandbox/${parent.id}/snapshot`, { name: "checkpoint-1" });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body).toMatchObject({ id: parent.id, state: "started" });
    const snap = (await f.call("GET", "/snapshots/checkpoint-1")).body;
    expect(snap).toMatchObject({ name: "checkpoint-1", state: "active" });
    // A duplicate name is a conflict.
    expect((await post(`/sandbox/${parent.id}/snapshot`, { name: "checkpoint-1" })).status).toBe(409);

    const child = await f.create({ snapshot: "checkpoint-1" });
    expect(child.state).toBe("started");
    expect(await sh(child.id, "cat ~/note.txt; python3 -c 'import widget; print(widget.make())'; pgrep -fc '^sh /home/sandbar/ticker' || true")).toBe("hello\n42\n0\n");
    // The parent kept running: its loop still writes.
    const before = Number(await sh(parent.id, "wc -l < ~/ticks"));
    await eventually("the parent's loop writes on", async () => Number(await sh(parent.id, "wc -l < ~/ticks")) > before, 10_000);
    // The snapshot cannot go while a sandbox uses it; the child's files are its own.
    await sh(child.id, "echo mine > ~/note.txt");
    expect(await sh(parent.id, "cat ~/note.txt")).toBe("hello\n");
    expect((await f.call("DELETE", `/sandbox/${child.id}`)).status).toBe(200);
  });

  it("a stopped sandbox is snapshotted as it is; one in another state is refused", async () => {
    const s = await f.create();
    expect((await post(`/sandbox/${s.id}/stop`)).status).toBe(200);
    const r = await post(`/sandbox/${s.id}/snapshot`, { name: "from-stopped" });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body.state).toBe("stopped");
    expect((await post(`/sandbox/${s.id}/archive`)).status).toBe(200);
    await eventually("archived", async () => (await f.call("GET", `/sandbox/${s.id}`)).body.state === "archived", 60_000);
    const refused = await post(`/sandbox/${s.id}/snapshot`, { name: "from-archived" });
    expect(refused.status).toBe(400);
    expect(refused.body.message).toBe("Sandbox must be started or stopped to create a snapshot");
    expect((await post(`/sandbox/${s.id}/fork`)).status).toBe(400);
  });
});

describe("fork", () => {
  it("a fork of a sandbox with 200 MB sees them; writes and deletions stay on their side; lineage; the parent's delete keeps its forks", async () => {
    const parent = await f.create({ labels: { team: "a" }, env: { FROM: "parent" } });
    await sh(parent.id, "mkdir -p ~/big && for i in 1 2 3 4; do head -c 50000000 /dev/urandom > ~/big/f$i; done && cd ~/big && sha256sum f* > ~/sums && echo a > ~/a && echo b > ~/b");
    const parentKey = await f.call("GET", `/sandbox/${parent.id}/signing-key`);
    expect(parentKey.status).toBe(200);
    const r = await post(`/sandbox/${parent.id}/fork`, { name: "fork-one" });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    const fork: SandboxDto = r.body;
    // Its own signing key: URLs signed for one never verify for the other, rotations stay apart.
    const forkKey = await f.call("GET", `/sandbox/${fork.id}/signing-key`);
    expect(forkKey.status).toBe(200);
    expect(forkKey.body).not.toEqual(parentKey.body);
    expect(fork).toMatchObject({ name: "fork-one", state: "started", labels: { team: "a" }, env: { FROM: "parent" } });
    expect(fork.id).not.toBe(parent.id);
    expect(await sh(fork.id, "cd ~/big && sha256sum -c --quiet ~/sums && echo same")).toBe("same\n");
    await sh(parent.id, "echo p > ~/a && rm ~/b && echo new > ~/p-only");
    await sh(fork.id, "echo f > ~/b && rm ~/a && echo new > ~/f-only && rm ~/big/f1");
    expect(await sh(parent.id, "cat ~/a; ls ~")).toBe("p\na\nbig\np-only\nsums\n");
    expect(await sh(fork.id, "cat ~/b; ls ~ ~/big")).toBe("f\n/home/sandbar:\nb\nbig\nf-only\nsums\n\n/home/sandbar/big:\nf2\nf3\nf4\n");
    expect((await f.call("GET", `/sandbox/${parent.id}`)).body.state).toBe("started");

    // Lineage, as the 0.218 client reads it.
    expect((await f.call("GET", `/sandbox/${parent.id}/forks`)).body.map((s: SandboxDto) => s.id)).toEqual([fork.id]);
    expect((await f.call("GET", `/sandbox/${fork.id}/parent`)).body.id).toBe(parent.id);
    expect((await f.call("GET", `/sandbox/${parent.id}/parent`)).status).toBe(404);
    // A name taken is a conflict, and nothing is made.
    expect((await post(`/sandbox/${parent.id}/fork`, { name: "fork-one" })).status).toBe(409);
    expect((await f.call("GET", `/sandbox/${parent.id}/forks`)).body).toHaveLength(1);

    // The parent goes; its fork stands on the layers, which stay while used.
    expect((await f.call("DELETE", `/sandbox/${parent.id}`)).status).toBe(200);
    await eventually("the parent destroyed", async () => (await f.manager.store.byId(parent.id))?.state === "destroyed", 60_000);
    await sweepLayers(f.manager, f.runtime, 0);
    expect((await post(`/sandbox/${fork.id}/stop`)).status).toBe(200);
    expect((await post(`/sandbox/${fork.id}/start`)).status).toBe(200);
    expect(await sh(fork.id, "cd ~/big && grep -v f1 ~/sums | sha256sum -c --quiet && echo intact")).toBe("intact\n");
    expect((await f.call("GET", `/sandbox/${fork.id}/ancestors`)).body).toEqual([]);
    // Its own delete frees its layers (no snapshot names them).
    const layers = (await f.manager.store.byId(fork.id))!.layers!;
    expect((await f.call("DELETE", `/sandbox/${fork.id}`)).status).toBe(200);
    await eventually("the fork destroyed", async () => (await f.manager.store.byId(fork.id))?.state === "destroyed", 60_000);
    await sweepLayers(f.manager, f.runtime, 0);
    const held = new Set((await f.runtime.listLayers()).map((l) => l.id));
    for (const l of layers) expect(held.has(l)).toBe(false);
  }, 300_000);

  it("N forks share one capture; forks of forks stack up to the bound, then squash, deletions kept", async () => {
    const parent = await f.create();
    await sh(parent.id, "echo 0 > ~/n && rm -f ~/.bashrc; echo");
    const r = await post(`/sandbox/${parent.id}/forks`, { count: 3, names: ["try-a"] });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body).toHaveLength(3);
    expect(r.body[0].name).toBe("try-a");
    const layerSets = await Promise.all(r.body.map(async (s: SandboxDto) => (await f.manager.store.byId(s.id))!.layers));
    expect(new Set(layerSets.map((l) => JSON.stringify(l))).size).toBe(1); // one capture
    for (const s of r.body as SandboxDto[]) expect(await sh(s.id, "cat ~/n")).toBe("0\n");
    expect((await post(`/sandbox/${parent.id}/forks`, { count: 11 })).status).toBe(400);

    let from: SandboxDto = r.body[0];
    for (let depth = 2; depth <= MAX_LAYERS + 1; depth++) {
      const seen = (await f.call("GET", `/sandbox/${from.id}`)).body;
      expect([depth, seen.state, seen.desiredState, seen.errorReason]).toEqual([depth, "started", "started", null]);
      await sh(from.id, `echo ${depth} > ~/n && echo x > ~/at-${depth} && rm -f ~/at-${depth - 1}`);
      const next = await post(`/sandbox/${from.id}/fork`);
      expect(next.status, JSON.stringify(next.body)).toBe(200);
      from = next.body;
      const layers = (await f.manager.store.byId(from.id))!.layers!;
      expect(layers.length).toBe(depth <= MAX_LAYERS ? depth : 1);
    }
    expect(await sh(from.id, "cat ~/n; ls ~; test -e ~/.bashrc || echo no-bashrc")).toBe(`${MAX_LAYERS + 1}\nat-${MAX_LAYERS + 1}\nn\nno-bashrc\n`);
    const ancestors = (await f.call("GET", `/sandbox/${from.id}/ancestors`)).body as SandboxDto[];
    expect(ancestors).toHaveLength(MAX_LAYERS + 1);
    expect(ancestors.at(-1)!.id).toBe(parent.id);
  }, 300_000);

  it("a fork of a stopped sandbox is started (the 0.218 client waits for it); a crash mid-capture leaves the parent as it was and no fork or snapshot", async () => {
    const parent = await f.create();
    expect((await post(`/sandbox/${parent.id}/stop`)).status).toBe(200);
    const r = await post(`/sandbox/${parent.id}/fork`);
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body.state).toBe("started");
    expect((await f.call("GET", `/sandbox/${parent.id}`)).body.state).toBe("stopped");
    // What a crash between the rows and the capture leaves: the parent `forking`, a fork row without its layer, a pending snapshot.
    const running = await f.create();
    await f.manager.store.update(running.id, { state: "forking" });
    const debris = (await post(`/sandbox/${parent.id}/fork`, { name: "debris" })).body as SandboxDto;
    await f.manager.store.update(debris.id, { state: "unknown", layers: ["l-never-captured"] });
    await f.t.server.orm.em.getConnection().execute(`insert into snapshot (id, organization_id, name, image_name, entrypoint, cpu, gpu, mem, disk, layers, runner_id) values (gen_random_uuid(), ?, 'half-made', 'x', '[]', 1, 0, 1, 3, '["l-never"]', ?)`, [f.orgId, f.runtime.runnerId]);
    await f.runtime.destroy(debris.id);
    await reconcile(f.manager);
    expect((await f.call("GET", `/sandbox/${running.id}`)).body.state).toBe("started");
    expect((await f.manager.store.byId(debris.id))!.state).toBe("destroyed");
    expect((await f.call("GET", "/snapshots/half-made")).status).toBe(404);
  }, 300_000);
});
