import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PREFIXES, startFixture, toolboxFetch, type Fixture } from "./test-fixture.ts";

// The toolbox routes the generic gateway serves, as the SDKs call them: directories, language
// servers (both spellings of workspace symbols), and the 404 body the SDKs key on.

let f: Fixture;
beforeAll(async () => {
  f = await startFixture();
});
afterAll(async () => f?.stop());

async function call(method: string, path: string, body?: unknown, prefix?: string) {
  const res = await toolboxFetch(f, path, { method, prefix, body: body === undefined ? undefined : JSON.stringify(body), headers: body === undefined ? {} : { "content-type": "application/json" } });
  const text = await res.text();
  return { status: res.status, json: text ? JSON.parse(text) : undefined };
}

describe("directories", () => {
  it.each(PREFIXES)("answers project-dir, user-home-dir and work-dir as {dir} (%s)", async (prefix) => {
    for (const path of ["/project-dir", "/user-home-dir", "/work-dir"]) {
      const res = await call("GET", path, undefined, prefix);
      expect(res.status).toBe(200);
      expect(res.json).toEqual({ dir: f.root });
    }
  });
});

describe("not found", () => {
  it("carries statusCode 404 in the body (the SDKs raise DaytonaNotFoundError on it)", async () => {
    for (const prefix of PREFIXES) {
      const res = await call("GET", "/no/such/route", undefined, prefix);
      expect(res.status).toBe(404);
      expect(res.json).toMatchObject({ statusCode: 404 });
    }
    const missing = await call("GET", `/files/info?path=${encodeURIComponent(join(f.root, "missing"))}`);
    expect(missing.json).toMatchObject({ statusCode: 404 });
  });
});

describe("language servers", () => {
  let project: string;
  let uri: string;
  beforeAll(async () => {
    project = join(f.root, "pyproj");
    await mkdir(project, { recursive: true });
    await writeFile(join(project, "main.py"), "def greet_someone(name):\n    return 'hi ' + name\n\nclass Greeter:\n    pass\n\ngreet_s");
    uri = `file://${join(project, "main.py")}`;
  });

  it("starts pylsp, opens a document and answers completions and document symbols", async () => {
    const server = { languageId: "python", pathToProject: project };
    expect((await call("POST", "/lsp/start", server)).status).toBe(200);
    expect((await call("POST", "/lsp/did-open", { ...server, uri })).status).toBe(200);

    const completions = await call("POST", "/lsp/completions", { ...server, uri, position: { line: 6, character: 7 } });
    expect(completions.status).toBe(200);
    expect(completions.json.items.map((i: { label: string }) => i.label).join(" ")).toContain("greet_someone");

    const q = new URLSearchParams({ ...server, uri }).toString();
    const docSymbols = await call("GET", `/lsp/document-symbols?${q}`);
    expect(docSymbols.json.map((s: { name: string }) => s.name)).toEqual(expect.arrayContaining(["greet_someone", "Greeter"]));
    expect(docSymbols.json[0].location).toMatchObject({ uri, range: { start: { line: expect.any(Number), character: expect.any(Number) } } });

    expect((await call("POST", "/lsp/did-close", { ...server, uri })).status).toBe(200);
    expect((await call("POST", "/lsp/stop", server)).status).toBe(200);
  });

  // pylsp has no workspace/symbol; typescript-language-server has.
  it("answers workspace symbols under both spellings (workspace-symbols: 0.25/0.111, workspacesymbols: 0.113+)", async () => {
    const tsProject = join(f.root, "tsproj");
    await mkdir(tsProject, { recursive: true });
    await writeFile(join(tsProject, "tsconfig.json"), "{}");
    await writeFile(join(tsProject, "index.ts"), "export class WidgetFactory {}\nexport function makeWidget() { return new WidgetFactory(); }\n");
    const server = { languageId: "typescript", pathToProject: tsProject };
    expect((await call("POST", "/lsp/start", server)).status).toBe(200);
    expect((await call("POST", "/lsp/did-open", { ...server, uri: `file://${join(tsProject, "index.ts")}` })).status).toBe(200);
    for (const prefix of PREFIXES) {
      for (const spelling of ["workspace-symbols", "workspacesymbols"]) {
        const ws = await call("GET", `/lsp/${spelling}?${new URLSearchParams({ ...server, query: "WidgetFactory" })}`, undefined, prefix);
        expect(ws.status).toBe(200);
        expect(ws.json.map((s: { name: string }) => s.name)).toContain("WidgetFactory");
      }
    }
    await call("POST", "/lsp/stop", server);
  });

  it("refuses calls to a server that was not started, and unknown languages", async () => {
    const res = await call("POST", "/lsp/completions", { languageId: "python", pathToProject: join(f.root, "never"), uri, position: { line: 0, character: 0 } });
    expect(res.status).toBeGreaterThanOrEqual(400);
    expect(res.json.statusCode).toBe(res.status);
    const bad = await call("POST", "/lsp/start", { languageId: "cobol", pathToProject: project });
    expect(bad.status).toBe(400);
  });
});
