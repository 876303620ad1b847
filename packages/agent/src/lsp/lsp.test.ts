import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdir, writeFile } from "node:fs/promises";
import * as path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { LanguageId, LspService } from "@sandbar/protocol/gen/sandbar/agent/v1/lsp_pb.js";
import { startAgentProcess } from "../testing/agent-process.ts";
import { descendants } from "../util/kill.ts";
import type { AgentProcess } from "../testing/agent-process.ts";

let agent: AgentProcess;
let lsp: ReturnType<typeof agent.client<typeof LspService>>;
beforeAll(async () => {
  agent = await startAgentProcess();
  lsp = agent.client(LspService);
});
afterAll(async () => {
  await agent?.stop();
});

const codeOf = async (p: Promise<unknown>) => (await p.then(() => undefined, (e: unknown) => ConnectError.from(e)))?.code;

const TS = `export function greetUser(name: string): string {
  return "hello " + name;
}

export class Counter {
  count = 0;
  increment(): number {
    return ++this.count;
  }
}

greet
`;

const PY = `def compute_total(items):
    return sum(items)


class Basket:
    def add(self, item):
        pass


comp
`;

describe("typescript-language-server", () => {
  const project = "tsproj";
  let file: string;
  beforeAll(async () => {
    await mkdir(path.join(agent.root, project));
    file = path.join(agent.root, project, "main.ts");
    await writeFile(file, TS);
    await writeFile(path.join(agent.root, project, "tsconfig.json"), JSON.stringify({ compilerOptions: { strict: true } }));
  });

  it("completes a function defined in the opened file, and lists its symbols on the right lines", async () => {
    await lsp.start({ languageId: LanguageId.TYPESCRIPT, pathToProject: project });
    const uri = `file://${file}`;
    await lsp.didOpen({ languageId: LanguageId.TYPESCRIPT, pathToProject: project, uri });
    const list = await lsp.completions({ languageId: LanguageId.TYPESCRIPT, pathToProject: project, uri, position: { line: 11, character: 5 } });
    const greet = list.items.find((i) => i.label === "greetUser");
    expect(greet).toBeDefined();
    expect(greet!.kind).toBe(3); // Function

    const { symbols } = await lsp.documentSymbols({ languageId: LanguageId.TYPESCRIPT, pathToProject: project, uri });
    const line = (name: string) => symbols.find((s) => s.name === name)?.location?.range?.start?.line;
    expect(line("greetUser")).toBe(0);
    expect(line("Counter")).toBe(4);
    expect(line("increment")).toBe(6);
    expect(symbols.find((s) => s.name === "Counter")).toMatchObject({ kind: 5, location: { uri } });

    const ws = await lsp.workspaceSymbols({ languageId: LanguageId.TYPESCRIPT, pathToProject: project, query: "Counter" });
    expect(ws.symbols.some((s) => s.name === "Counter" && s.location?.uri === uri && s.location.range?.start?.line === 4)).toBe(true);

    // A javascript caller of the same project shares the server.
    await lsp.didClose({ languageId: LanguageId.JAVASCRIPT, pathToProject: project, uri });
    await lsp.stop({ languageId: LanguageId.TYPESCRIPT, pathToProject: project });
    expect(await codeOf(lsp.documentSymbols({ languageId: LanguageId.TYPESCRIPT, pathToProject: project, uri }))).toBe(Code.FailedPrecondition);
    // Stopping ends the server and the tsserver processes it started.
    expect(descendants(agent.child.pid!)).toEqual([]);
  });
});

describe("pylsp", () => {
  const project = "pyproj";
  let file: string;
  beforeAll(async () => {
    await mkdir(path.join(agent.root, project));
    file = path.join(agent.root, project, "app.py");
    await writeFile(file, PY);
  });

  it("completes a function defined in the opened file, and lists its symbols on the right lines", async () => {
    await lsp.start({ languageId: LanguageId.PYTHON, pathToProject: project });
    const uri = `file://${file}`;
    await lsp.didOpen({ languageId: LanguageId.PYTHON, pathToProject: project, uri });
    const list = await lsp.completions({ languageId: LanguageId.PYTHON, pathToProject: project, uri, position: { line: 9, character: 4 } });
    expect(list.items.map((i) => i.label)).toContain("compute_total(items)");

    const { symbols } = await lsp.documentSymbols({ languageId: LanguageId.PYTHON, pathToProject: project, uri });
    const line = (name: string) => symbols.find((s) => s.name === name)?.location?.range?.start?.line;
    expect(line("compute_total")).toBe(0);
    expect(line("Basket")).toBe(4);
    expect(line("add")).toBe(5);

    // pylsp has no workspace/symbol: the project's index answers, across files, by substring.
    await mkdir(path.join(agent.root, project, "pkg"));
    await writeFile(path.join(agent.root, project, "pkg", "more.py"), "class BasketItem:\n    def weigh(self):\n        pass\n\nMAX_BASKETS = 3\n");
    await writeFile(path.join(agent.root, project, "pkg", "broken.py"), "def (:\n");
    const ws = await lsp.workspaceSymbols({ languageId: LanguageId.PYTHON, pathToProject: project, query: "basket" });
    const found = ws.symbols.map((s) => ({ name: s.name, kind: s.kind, file: s.location?.uri.split("/").at(-1), line: s.location?.range?.start?.line }));
    expect(found).toEqual(
      expect.arrayContaining([
        { name: "Basket", kind: 5, file: "app.py", line: 4 },
        { name: "BasketItem", kind: 5, file: "more.py", line: 0 },
        { name: "MAX_BASKETS", kind: 14, file: "more.py", line: 4 },
      ]),
    );
    expect(found.map((s) => s.name)).not.toContain("compute_total");
    expect((await lsp.workspaceSymbols({ languageId: LanguageId.PYTHON, pathToProject: project, query: "weigh" })).symbols).toMatchObject([{ name: "weigh", kind: 6 }]);
    await lsp.stop({ languageId: LanguageId.PYTHON, pathToProject: project });
  });
});

describe("bad input", () => {
  it("answers with clear errors", async () => {
    await mkdir(path.join(agent.root, "p"), { recursive: true });
    const uri = `file://${path.join(agent.root, "p", "x.py")}`;
    expect(await codeOf(lsp.didOpen({ languageId: LanguageId.PYTHON, pathToProject: "p", uri }))).toBe(Code.FailedPrecondition);
    expect(await codeOf(lsp.start({ languageId: LanguageId.UNSPECIFIED, pathToProject: "p" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(lsp.start({ languageId: LanguageId.PYTHON, pathToProject: "missing-project" }))).toBe(Code.NotFound);
    expect(await codeOf(lsp.stop({ languageId: LanguageId.PYTHON, pathToProject: "p" }))).toBe(Code.FailedPrecondition);
    await lsp.start({ languageId: LanguageId.PYTHON, pathToProject: "p" });
    expect(await codeOf(lsp.didOpen({ languageId: LanguageId.PYTHON, pathToProject: "p", uri }))).toBe(Code.NotFound);
    expect(await codeOf(lsp.didOpen({ languageId: LanguageId.PYTHON, pathToProject: "p", uri: "" }))).toBe(Code.InvalidArgument);
    await lsp.stop({ languageId: LanguageId.PYTHON, pathToProject: "p" });
  });
});
