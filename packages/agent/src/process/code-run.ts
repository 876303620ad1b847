import { randomUUID } from "node:crypto";
import { rm, writeFile } from "node:fs/promises";
import * as path from "node:path";
import type { JsonObject } from "@bufbuild/protobuf";
import { errors } from "@sandbar/protocol";
import { CodeLanguage } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import type { AgentContext } from "../context.ts";
import { shellQuote } from "../util/shell.ts";
import { execute } from "./execute.ts";
import type { ShellLauncher } from "./launcher.ts";
import { fsCall } from "../util/fs-errors.ts";

/** Output lines with this prefix carry a chart (JSON) rather than text. */
const ARTIFACT_PREFIX = "dtn_artifact_k39fd2:";

export interface CodeRunInput {
  code: string;
  language: CodeLanguage;
  argv: string[];
  envs: Record<string, string>;
  timeout?: number;
}

/** The script that runs a code file with its language's interpreter. */
function commandFor(ctx: AgentContext, language: CodeLanguage, file: string, argv: string[]): string {
  const args = argv.map(shellQuote).join(" ");
  const node = shellQuote(process.execPath);
  switch (language) {
    case CodeLanguage.UNSPECIFIED:
    case CodeLanguage.PYTHON:
      return `python3 -u ${shellQuote(file)} ${args}`;
    case CodeLanguage.JAVASCRIPT:
      return `${node} ${shellQuote(file)} ${args}`;
    case CodeLanguage.TYPESCRIPT:
      return `${node} --no-warnings --experimental-transform-types ${shellQuote(file)} ${args}`;
    default:
      throw errors.invalidArgument(`unsupported language: ${language}`);
  }
}

const extension: Record<number, string> = {
  [CodeLanguage.UNSPECIFIED]: ".py",
  [CodeLanguage.PYTHON]: ".py",
  [CodeLanguage.JAVASCRIPT]: ".js",
  [CodeLanguage.TYPESCRIPT]: ".ts",
};

/** Splits chart artifacts out of a run's output. */
function extractArtifacts(result: string): { result: string; charts: JsonObject[] } {
  if (!result.includes(ARTIFACT_PREFIX)) return { result, charts: [] };
  const charts: JsonObject[] = [];
  const kept: string[] = [];
  for (const line of result.split("\n")) {
    if (line.startsWith(ARTIFACT_PREFIX)) {
      try {
        const artifact = JSON.parse(line.slice(ARTIFACT_PREFIX.length)) as { type?: string; value?: JsonObject };
        if (artifact.type === "chart" && artifact.value && typeof artifact.value === "object") charts.push(artifact.value);
        continue;
      } catch {
        // Not an artifact after all: keep the line.
      }
    }
    kept.push(line);
  }
  return { result: kept.join("\n"), charts };
}

/** Runs code with python3, node, or node with TypeScript types transformed. */
export async function codeRun(ctx: AgentContext, launcher: ShellLauncher, input: CodeRunInput, signal?: AbortSignal) {
  if (extension[input.language] === undefined) throw errors.invalidArgument(`unsupported language: ${input.language}`);
  const file = path.join(ctx.stateDir, `code-${randomUUID()}${extension[input.language]}`);
  // Node sees argv as [node, ...argv], like the reference's `node -`.
  const code = input.language === CodeLanguage.JAVASCRIPT || input.language === CodeLanguage.TYPESCRIPT
    ? `process.argv.splice(1, 1);\n${input.code}`
    : input.code;
  await fsCall(file, () => writeFile(file, code, { mode: 0o600 }));
  try {
    const out = await execute(ctx, launcher, { command: commandFor(ctx, input.language, file, input.argv), envs: input.envs, timeout: input.timeout }, signal);
    const { result, charts } = extractArtifacts(out.result);
    return { exitCode: out.exitCode, result, artifacts: charts.length ? { charts } : undefined };
  } finally {
    await rm(file, { force: true });
  }
}
