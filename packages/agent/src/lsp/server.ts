import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import * as path from "node:path";
import { pathToFileURL } from "node:url";
import { errors } from "@sandbar/protocol";
import type { AgentContext } from "../context.ts";
import { signalTree } from "../util/kill.ts";
import { asUserProcess } from "../process/user-spawn.ts";
import { JsonRpcConnection, RpcError } from "./jsonrpc.ts";

/** The two servers the agent runs: typescript-language-server (TS and JS) and pylsp. */
export type ServerKind = "typescript" | "python";

const REQUEST_TIMEOUT_MS = 30_000;
const STOP_TIMEOUT_MS = 2_000;

/** How to start a server: a command the environment can override. */
function commandFor(kind: ServerKind, env: NodeJS.ProcessEnv): string[] {
  if (kind === "python") return [env.SANDBAR_PYLSP || "pylsp"];
  if (env.SANDBAR_TS_LANGUAGE_SERVER) return [env.SANDBAR_TS_LANGUAGE_SERVER, "--stdio"];
  // Resolved beside the agent (its node_modules, or the bundle's), run by the agent's own node.
  const cli = createRequire(import.meta.url).resolve("typescript-language-server/lib/cli.mjs");
  return [process.execPath, cli, "--stdio"];
}

/** The LSP language id of a document, by its extension. */
function documentLanguage(file: string, fallback: string): string {
  switch (path.extname(file).toLowerCase()) {
    case ".ts":
    case ".mts":
    case ".cts":
      return "typescript";
    case ".tsx":
      return "typescriptreact";
    case ".js":
    case ".mjs":
    case ".cjs":
      return "javascript";
    case ".jsx":
      return "javascriptreact";
    case ".py":
    case ".pyi":
      return "python";
    default:
      return fallback;
  }
}

const symbolKinds = Array.from({ length: 26 }, (_, i) => i + 1);

/** What the agent tells servers it can do: flat symbols, plain or markdown docs. */
function clientCapabilities() {
  return {
    textDocument: {
      synchronization: { dynamicRegistration: false, didSave: false, willSave: false },
      completion: {
        dynamicRegistration: false,
        completionItem: { snippetSupport: true, documentationFormat: ["markdown", "plaintext"] },
        contextSupport: true,
      },
      documentSymbol: { dynamicRegistration: false, symbolKind: { valueSet: symbolKinds }, hierarchicalDocumentSymbolSupport: false },
    },
    workspace: {
      symbol: { dynamicRegistration: false, symbolKind: { valueSet: symbolKinds } },
      workspaceFolders: true,
      configuration: true,
    },
    window: { workDoneProgress: false },
  };
}

/** One running language server for one project. */
export class LanguageServer {
  readonly kind: ServerKind;
  readonly projectPath: string;
  private child: ChildProcess | undefined;
  private rpc: JsonRpcConnection | undefined;
  private readonly open = new Map<string, number>();
  private stderrTail = "";
  /** What the server said it can do, from its initialize answer. */
  private capabilities: Record<string, unknown> = {};
  private exited = false;
  private readonly ctx: AgentContext;
  private readonly onExit: () => void;

  constructor(ctx: AgentContext, kind: ServerKind, projectPath: string, onExit: () => void) {
    this.ctx = ctx;
    this.kind = kind;
    this.projectPath = projectPath;
    this.onExit = onExit;
  }

  get rootUri(): string {
    return pathToFileURL(this.projectPath).href;
  }

  async start(): Promise<void> {
    const [cmd, ...args] = commandFor(this.kind, this.ctx.env);
    const child = spawn(...asUserProcess(cmd, args, this.ctx.env), { cwd: this.projectPath, env: this.ctx.env, stdio: ["pipe", "pipe", "pipe"], detached: true });
    this.child = child;
    const rpc = new JsonRpcConnection(child.stdout!, child.stdin!);
    this.rpc = rpc;
    child.stderr!.setEncoding("utf8");
    child.stderr!.on("data", (d: string) => (this.stderrTail = (this.stderrTail + d).slice(-2000)));
    const gone = (why: string) => {
      if (this.exited) return;
      this.exited = true;
      rpc.close(errors.failedPrecondition(`the ${this.kind} language server for ${this.projectPath} ${why}${this.stderrTail ? `: ${this.stderrTail.trim().split("\n").at(-1)}` : ""}`));
      this.onExit();
    };
    child.once("error", (err) => gone(`could not start (${(err as NodeJS.ErrnoException).code === "ENOENT" ? `${cmd} is not installed` : err.message})`));
    child.once("exit", (code, signal) => gone(`exited (${signal ?? `code ${code}`})`));
    rpc.onRequest = (method, params) => this.answerServer(method, params);
    const init = await this.request<{ capabilities?: Record<string, unknown> } | null>("initialize", {
      processId: process.pid,
      clientInfo: { name: "sandbar-agent" },
      rootUri: this.rootUri,
      rootPath: this.projectPath,
      workspaceFolders: [{ uri: this.rootUri, name: path.basename(this.projectPath) }],
      capabilities: clientCapabilities(),
      initializationOptions: {},
    });
    this.capabilities = init?.capabilities ?? {};
    rpc.notify("initialized", {});
  }

  /** Whether the server answers workspace/symbol (pylsp does not). */
  get hasWorkspaceSymbols(): boolean {
    const p = this.capabilities.workspaceSymbolProvider;
    return p !== undefined && p !== null && p !== false;
  }

  /** Requests servers make of their client, answered with "nothing configured". */
  private answerServer(method: string, params: unknown): unknown {
    switch (method) {
      case "workspace/configuration":
        return ((params as { items?: unknown[] })?.items ?? []).map(() => null);
      case "workspace/workspaceFolders":
        return [{ uri: this.rootUri, name: path.basename(this.projectPath) }];
      case "client/registerCapability":
      case "client/unregisterCapability":
      case "window/workDoneProgress/create":
        return null;
      case "window/showMessageRequest":
        return null;
      default:
        throw new RpcError(-32601, `${method} is not supported by this client`);
    }
  }

  async request<T>(method: string, params: unknown): Promise<T> {
    if (!this.rpc) throw errors.failedPrecondition("language server not started");
    try {
      return await this.rpc.request<T>(method, params, REQUEST_TIMEOUT_MS);
    } catch (err) {
      if (err instanceof RpcError) {
        if (err.code === -32803) throw errors.deadlineExceeded(`the ${this.kind} language server did not answer ${method} in time`);
        throw errors.internal(`the ${this.kind} language server failed ${method}: ${err.message}`);
      }
      throw err;
    }
  }

  private notify(method: string, params: unknown): void {
    if (!this.rpc) throw errors.failedPrecondition("language server not started");
    this.rpc.notify(method, params);
  }

  /** Opens (or, when open, refreshes) a document with the file's current text. */
  async didOpen(uri: string, file: string, fallbackLanguage: string): Promise<void> {
    let text: string;
    try {
      text = await readFile(file, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") throw errors.notFound(`no such file: ${file}`);
      throw errors.invalidArgument(`cannot read ${file}: ${(err as Error).message}`);
    }
    const version = this.open.get(uri);
    if (version === undefined) {
      this.open.set(uri, 1);
      this.notify("textDocument/didOpen", { textDocument: { uri, languageId: documentLanguage(file, fallbackLanguage), version: 1, text } });
    } else {
      this.open.set(uri, version + 1);
      this.notify("textDocument/didChange", { textDocument: { uri, version: version + 1 }, contentChanges: [{ text }] });
    }
  }

  didClose(uri: string): void {
    if (!this.open.delete(uri)) return;
    this.notify("textDocument/didClose", { textDocument: { uri } });
  }

  /** Shuts the server down, and ends its process if it does not leave by itself. */
  async stop(): Promise<void> {
    const child = this.child;
    if (!child || this.exited) return;
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    try {
      await Promise.race([this.rpc!.request("shutdown", null, STOP_TIMEOUT_MS), exited]);
      this.rpc!.notify("exit", null);
    } catch {
      // Unresponsive: ended below.
    }
    const timer = setTimeout(() => child.pid !== undefined && signalTree(child.pid, "SIGKILL"), STOP_TIMEOUT_MS);
    await exited;
    clearTimeout(timer);
    // Children it left behind (tsserver) go with it.
    if (child.pid !== undefined) signalTree(child.pid, "SIGKILL");
  }
}
