import { stat } from "node:fs/promises";
import { errors } from "@sandbar/protocol";
import { LanguageId } from "@sandbar/protocol/gen/sandbar/agent/v1/lsp_pb.js";
import type { AgentContext } from "../context.ts";
import { resolvePath } from "../util/paths.ts";
import { LanguageServer } from "./server.ts";
import type { ServerKind } from "./server.ts";

function serverKind(language: LanguageId): ServerKind {
  switch (language) {
    case LanguageId.TYPESCRIPT:
    case LanguageId.JAVASCRIPT:
      return "typescript";
    case LanguageId.PYTHON:
      return "python";
    default:
      throw errors.invalidArgument("languageId must be python, typescript or javascript");
  }
}

/** The agent's language servers, one per (server, project path); TS and JS share one. */
export class LspManager {
  private readonly servers = new Map<string, Promise<LanguageServer>>();
  private readonly ctx: AgentContext;

  constructor(ctx: AgentContext) {
    this.ctx = ctx;
  }

  private key(language: LanguageId, projectPath: string): { key: string; kind: ServerKind; dir: string } {
    const kind = serverKind(language);
    const dir = resolvePath(this.ctx.workDir, projectPath, "pathToProject");
    return { key: `${kind}\0${dir}`, kind, dir };
  }

  async start(language: LanguageId, projectPath: string): Promise<void> {
    const { key, kind, dir } = this.key(language, projectPath);
    if (!this.servers.has(key)) {
      const st = await stat(dir).catch(() => undefined);
      if (!st) throw errors.notFound(`project path not found: ${dir}`);
      if (!st.isDirectory()) throw errors.invalidArgument(`project path is not a directory: ${dir}`);
    }
    let starting = this.servers.get(key);
    if (!starting) {
      const server: LanguageServer = new LanguageServer(this.ctx, kind, dir, () => {
        if (this.servers.get(key) === starting) this.servers.delete(key);
      });
      starting = server.start().then(() => server);
      this.servers.set(key, starting);
      starting.catch(() => {
        if (this.servers.get(key) === starting) this.servers.delete(key);
      });
    }
    await starting;
  }

  /** The started server for a project; FAILED_PRECONDITION when there is none. */
  async get(language: LanguageId, projectPath: string): Promise<LanguageServer> {
    const { key, kind, dir } = this.key(language, projectPath);
    const s = this.servers.get(key);
    if (!s) throw errors.failedPrecondition(`no ${kind} language server is started for ${dir}: call Start first`);
    return s;
  }

  async stop(language: LanguageId, projectPath: string): Promise<void> {
    const { key, kind, dir } = this.key(language, projectPath);
    const s = this.servers.get(key);
    if (!s) throw errors.failedPrecondition(`no ${kind} language server is started for ${dir}`);
    this.servers.delete(key);
    await (await s).stop();
  }

  async closeAll(): Promise<void> {
    const all = [...this.servers.values()];
    this.servers.clear();
    await Promise.allSettled(all.map(async (s) => (await s).stop()));
  }
}
