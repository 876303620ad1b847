import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { cp, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { InfoService } from "@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js";
import { LanguageId, LspService } from "@sandbar/protocol/gen/sandbar/agent/v1/lsp_pb.js";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { PtyService } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import { buildAgent } from "../build.ts";
import { snapshotBlobName, snapshotNodeArgs } from "../snapshot-blob.ts";
import { startAgentProcess } from "./testing/agent-process.ts";
import type { AgentProcess } from "./testing/agent-process.ts";
import { descendants } from "./util/kill.ts";
import { AGENT_VERSION } from "./version.ts";

// The bundle the runner mounts into sandboxes, built fresh and run from a
// directory of its own: nothing may resolve back into the source tree.
let out: string;
let entry: string;
let agent: AgentProcess;
beforeAll(async () => {
  out = await mkdtemp(path.join(tmpdir(), "agent-bundle-"));
  entry = await buildAgent(path.join(out, "dist"));
  agent = await startAgentProcess({ command: [process.execPath, entry] });
});
afterAll(async () => {
  await agent?.stop();
  await rm(out, { recursive: true, force: true });
});

describe("the bundle", () => {
  it("serves every area: info, files, processes, sessions, PTY (native module), typescript language server", async () => {
    await servesEveryArea(agent);
  });
});

describe("the startup snapshot", () => {
  it("is built beside the bundle for this node, and chosen only for a node of its version and architecture", async () => {
    const dist = path.dirname(entry);
    expect(await readdir(dist)).toContain(snapshotBlobName());
    expect(snapshotBlobName()).toBe(`agent-${process.version}-${process.arch}.blob`);
    expect(snapshotNodeArgs(dist, "/opt/sandbar/agent")).toEqual(["--snapshot-blob", `/opt/sandbar/agent/${snapshotBlobName()}`]);
    // Another node (version or architecture) finds no blob of its name: it runs agent.mjs.
    expect(snapshotNodeArgs(dist, "/opt/sandbar/agent", "v23.0.0")).toEqual([]);
    expect(snapshotNodeArgs(dist, "/opt/sandbar/agent", process.version, "arm64")).toEqual(process.arch === "arm64" ? ["--snapshot-blob", `/opt/sandbar/agent/${snapshotBlobName()}`] : []);
  });

  it("starts the agent from the blob alone (no main.mjs, no chunks) and serves every area as the bundle does", async () => {
    // A copy of the bundle without the ESM agent: what answers can only come from the snapshot;
    // node_modules stays (node-pty and the language server load from there at run time).
    const dist = path.join(out, "snapshot-only");
    await cp(path.dirname(entry), dist, { recursive: true });
    for (const gone of ["main.mjs", "main.mjs.map", "chunks", "compile-cache"]) await rm(path.join(dist, gone), { recursive: true, force: true });
    const fromSnapshot = await startAgentProcess({ command: [process.execPath, ...snapshotNodeArgs(dist, dist), path.join(dist, "agent.mjs")], extraArgs: ["--preload"] });
    try {
      // Read at run time, not frozen at build time: the environment and the command line.
      const cmdline = (await readFile(`/proc/${fromSnapshot.child.pid}/cmdline`, "utf8")).split("\0");
      expect(cmdline).toContain("--snapshot-blob");
      expect((await fromSnapshot.client(ProcessService).execute({ command: 'echo "$HOME"' })).result).toBe(`${fromSnapshot.root}\n`);
      await servesEveryArea(fromSnapshot);
    } finally {
      await fromSnapshot.stop();
    }
  });

  it.runIf(spawnSync("unshare", ["--pid", "--fork", "--mount-proc", "true"]).status === 0)("as PID 1, becomes the reaping init and starts the agent again from the blob", async () => {
    const dist = path.dirname(entry);
    const asInit = await startAgentProcess({ command: ["unshare", "--pid", "--fork", "--mount-proc", process.execPath, ...snapshotNodeArgs(dist, dist), entry] });
    try {
      const { result } = await asInit.client(ProcessService).execute({ command: "tr '\\0' ' ' < /proc/1/cmdline" });
      // execArgv carries the blob through the init's exec.
      expect(result).toContain(`sandbar-init ${process.execPath} --snapshot-blob ${path.join(dist, snapshotBlobName())} ${entry} --socket`);
      // The init forwards SIGTERM to the agent, which shuts down cleanly.
      const exited = new Promise<number | null>((resolve) => asInit.child.once("exit", (code) => resolve(code)));
      process.kill(descendants(asInit.child.pid!)[0]!, "SIGTERM");
      expect(await exited).toBe(0);
    } finally {
      await asInit.stop();
    }
  });
});

async function servesEveryArea(agent: AgentProcess): Promise<void> {
  expect((await agent.client(InfoService).getVersion({})).version).toBe(AGENT_VERSION);
  expect((await agent.client(ProcessService).execute({ command: "echo bundled" })).result).toBe("bundled\n");
  await writeFile(path.join(agent.root, "f.txt"), "x");
  expect((await agent.client(FileService).listFiles({})).items.map((i) => i.name)).toContain("f.txt");

  const pty = agent.client(PtyService);
  await pty.createPty({ id: "p", lazyStart: false });
  expect((await pty.getPty({ sessionId: "p" })).active).toBe(true);
  await pty.deletePty({ sessionId: "p" });

  const lsp = agent.client(LspService);
  await mkdir(path.join(agent.root, "ts"));
  const file = path.join(agent.root, "ts", "a.ts");
  await writeFile(file, "export function fromBundle() {}\n");
  await lsp.start({ languageId: LanguageId.TYPESCRIPT, pathToProject: "ts" });
  await lsp.didOpen({ languageId: LanguageId.TYPESCRIPT, pathToProject: "ts", uri: `file://${file}` });
  const { symbols } = await lsp.documentSymbols({ languageId: LanguageId.TYPESCRIPT, pathToProject: "ts", uri: `file://${file}` });
  expect(symbols.map((s) => s.name)).toContain("fromBundle");
  await lsp.stop({ languageId: LanguageId.TYPESCRIPT, pathToProject: "ts" });

  const proc = agent.client(ProcessService);
  await proc.createSession({ sessionId: "s" });
  await proc.sessionExecute({ sessionId: "s", command: "cd ts && export KEPT=yes" });
  const res = await proc.sessionExecute({ sessionId: "s", command: 'echo "$PWD $KEPT"' });
  expect(res.exitCode).toBe(0);
  const stdout = res.chunks.flatMap((c) => (c.data.case === "stdout" ? [Buffer.from(c.data.value).toString()] : [])).join("");
  expect(stdout).toBe(`${agent.root}/ts yes\n`);
  await proc.deleteSession({ sessionId: "s" });
}
