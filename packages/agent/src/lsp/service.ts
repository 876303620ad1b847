import { fromJson } from "@bufbuild/protobuf";
import type { JsonValue } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import { LanguageId } from "@sandbar/protocol/gen/sandbar/agent/v1/lsp_pb.js";
import type { LspService } from "@sandbar/protocol/gen/sandbar/agent/v1/lsp_pb.js";
import type { AgentContext } from "../context.ts";
import { uriToPath } from "../util/paths.ts";
import type { LspManager } from "./manager.ts";
import { pythonWorkspaceSymbols } from "./python-index.ts";
import { pathToFileURL } from "node:url";

interface LspRange {
  start: { line: number; character: number };
  end: { line: number; character: number };
}
interface RawSymbol {
  name: string;
  kind: number;
  location?: { uri: string; range?: LspRange };
  range?: LspRange;
  children?: RawSymbol[];
}
interface RawCompletionItem {
  label: string;
  kind?: number;
  detail?: string;
  documentation?: JsonValue;
  sortText?: string;
  filterText?: string;
  insertText?: string;
}

const languageName: Record<number, string> = {
  [LanguageId.PYTHON]: "python",
  [LanguageId.TYPESCRIPT]: "typescript",
  [LanguageId.JAVASCRIPT]: "javascript",
};

/** Flat symbols in the reference's shape, from flat or hierarchical answers. */
function flattenSymbols(raw: RawSymbol[] | null, uri: string | undefined) {
  const out: { name: string; kind: number; location: { uri: string; range: LspRange | undefined } }[] = [];
  const walk = (list: RawSymbol[]) => {
    for (const s of list) {
      out.push({ name: s.name, kind: s.kind, location: { uri: s.location?.uri ?? uri ?? "", range: s.location?.range ?? s.range } });
      if (s.children) walk(s.children);
    }
  };
  walk(raw ?? []);
  return out;
}

export function createLspService(ctx: AgentContext, lsps: LspManager): ServiceImpl<typeof LspService> {
  /** The document's file:// URI (as the server knows it) and path. */
  const doc = (uri: string) => {
    if (uri === "") throw errors.invalidArgument("uri is required");
    const file = uriToPath(ctx.workDir, uri);
    return { uri: pathToFileURL(file).href, file };
  };

  return {
    async start(req) {
      await lsps.start(req.languageId, req.pathToProject);
      return {};
    },
    async stop(req) {
      await lsps.stop(req.languageId, req.pathToProject);
      return {};
    },
    async didOpen(req) {
      const server = await lsps.get(req.languageId, req.pathToProject);
      const { uri, file } = doc(req.uri);
      await server.didOpen(uri, file, languageName[req.languageId]);
      return {};
    },
    async didClose(req) {
      const server = await lsps.get(req.languageId, req.pathToProject);
      server.didClose(doc(req.uri).uri);
      return {};
    },
    async completions(req) {
      const server = await lsps.get(req.languageId, req.pathToProject);
      const { uri } = doc(req.uri);
      const position = { line: req.position?.line ?? 0, character: req.position?.character ?? 0 };
      const context = req.context
        ? { triggerKind: req.context.triggerKind || 1, ...(req.context.triggerCharacter ? { triggerCharacter: req.context.triggerCharacter } : {}) }
        : undefined;
      const raw = await server.request<RawCompletionItem[] | { isIncomplete: boolean; items: RawCompletionItem[] } | null>("textDocument/completion", {
        textDocument: { uri },
        position,
        ...(context ? { context } : {}),
      });
      const list = Array.isArray(raw) ? { isIncomplete: false, items: raw } : (raw ?? { isIncomplete: false, items: [] });
      return {
        isIncomplete: list.isIncomplete,
        items: list.items.map((i) => ({
          label: i.label,
          kind: i.kind,
          detail: i.detail ?? undefined,
          documentation: i.documentation === undefined || i.documentation === null ? undefined : fromJson(ValueSchema, i.documentation),
          sortText: i.sortText,
          filterText: i.filterText,
          insertText: i.insertText,
        })),
      };
    },
    async documentSymbols(req) {
      const server = await lsps.get(req.languageId, req.pathToProject);
      const { uri } = doc(req.uri);
      const raw = await server.request<RawSymbol[] | null>("textDocument/documentSymbol", { textDocument: { uri } });
      return { symbols: flattenSymbols(raw, uri) };
    },
    async workspaceSymbols(req) {
      const server = await lsps.get(req.languageId, req.pathToProject);
      if (!server.hasWorkspaceSymbols) {
        // pylsp has no workspace/symbol: the project's index answers; other servers without it find nothing.
        return { symbols: server.kind === "python" ? await pythonWorkspaceSymbols(ctx, server.projectPath, req.query) : [] };
      }
      const raw = await server.request<RawSymbol[] | null>("workspace/symbol", { query: req.query });
      return { symbols: flattenSymbols(raw, undefined) };
    },
  };
}
