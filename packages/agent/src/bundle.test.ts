import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { InfoService } from "@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js";
import { LanguageId, LspService } from "@sandbar/protocol/gen/sandbar/agent/v1/lsp_pb.js";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { PtyService } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import { buildAgent } from "../build.ts";
import { startAgentProcess } from "./testing/agent-process.ts";
import type { AgentProcess } from "./testing/agent-process.ts";
import { AGENT_VERSION } from "./version.ts";

// The bundle the runner mounts into sandboxes, built fresh and run from a
// directory of its own: nothing may resolve back into the source tree.
let out: string;
let agent: AgentProcess;
beforeAll(async () => {
  out = await mkdtemp(path.join(tmpdir(), "agent-bundle-"));
  const entry = await buildAgent(path.join(out, "dist"));
  agent = await startAgentProcess({ command: [process.execPath, entry] });
});
afterAll(async () => {
  await agent?.stop();
  await rm(out, { recursive: true, force: true });
});

describe("the bundle", () => {
  it("serves every area: info, files, processes, PTY (native module), typescript language server", async () => {
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
  });
});
