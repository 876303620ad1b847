/**
 * The official Daytona SDK clients against a real control server running real sandboxes: each
 * suite starts one server with a freshly built agent bundle (as the sandbox lifecycle tests do)
 * and creates its one sandbox through the SDK under test. Run as root (the local runtime).
 */
import { rm } from "node:fs/promises";
import { createRequire } from "node:module";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { buildAgentBundle, startTestServer, type TestServer } from "@sandbar/control/testing";
import { expect } from "vitest";
import type { TestRegistry } from "../../packages/runner/src/images/testing/registry.ts";
import type { ControlOptions } from "../../packages/control/src/server/control-server.ts";
import type { Settings } from "../../packages/control/src/settings.ts";

const PROTO_ROOT = fileURLToPath(new URL("../../proto", import.meta.url));

export interface RealServer {
  server: TestServer;
  /** The SDKs' apiUrl: `{server}/api`. */
  apiUrl: string;
  adminKey: string;
  stop(): Promise<void>;
}

/** `settings`: the server's own (e.g. a scaled timer clock). */
export async function startRealServer(control?: ControlOptions, settings: Partial<Settings> = {}): Promise<RealServer> {
  if (process.getuid?.() !== 0) throw new Error("the SDK suites run real sandboxes: run them as root");
  const bundle = await buildAgentBundle("sandbar-sdk-agent-");
  const server = await startTestServer({ settings: { ...settings, agentBundle: bundle }, control });
  return {
    server,
    apiUrl: `${server.url}/api`,
    adminKey: server.adminKey,
    async stop() {
      await server.stop();
      await rm(bundle, { recursive: true, force: true });
    },
  };
}

/** A label value unique to this run, so list-by-labels only sees this suite's sandbox. */
export const runLabel = () => `sdk-${process.pid}-${Date.now().toString(36)}`;

/**
 * A shell script run inside the sandbox (with the sandbox's git) that makes a bare repository
 * with one commit on main, for clone/push/pull.
 */
export function originScript(bare: string): string {
  const seed = `${bare}-seed`;
  return [
    "set -e",
    `git init -q --bare -b main ${bare}`,
    `git init -q -b main ${seed}`,
    `cd ${seed}`,
    "echo seed > seed.txt",
    "git add seed.txt",
    "git -c user.name=t -c user.email=t@example.com -c commit.gpgsign=false commit -q -m seed",
    `git push -q ${bare} main`,
    "echo ok",
  ].join("\n");
}

/** A python module for pylsp completions and document symbols. */
export const PY_MODULE = "class WidgetFactory:\n    pass\n\n\ndef make_widget():\n    return WidgetFactory()\n\n\nmake_w";

/** sandbar.agent.v1.LogChunk as @grpc/proto-loader decodes it (oneof data, no defaults). */
type LogChunk = { stdout?: Buffer; stderr?: Buffer };

/** Follows a session command's log with @grpc/grpc-js on the control port: stdout and stderr apart. */
export async function followLogsOverGrpc(s: RealServer, sandboxId: string, sessionId: string, commandId: string): Promise<{ stdout: string; stderr: string }> {
  const def = protoLoader.loadSync("sandbar/agent/v1/process.proto", { includeDirs: [PROTO_ROOT, join(PROTO_ROOT, "vendor")], keepCase: false, longs: Number, enums: String, defaults: false, oneofs: true });
  const ProcessService = serviceAt(grpc.loadPackageDefinition(def), "sandbar.agent.v1.ProcessService");
  const client = new ProcessService(s.server.url.replace("http://", ""), grpc.credentials.createInsecure());
  try {
    const md = new grpc.Metadata();
    md.set("authorization", `Bearer ${s.adminKey}`);
    md.set("x-sandbar-sandbox-id", sandboxId);
    // What client.streamSessionCommandLogs() sends, through its typed form: the loaded method's path and codecs.
    const method = ProcessService.service.StreamSessionCommandLogs;
    const stream = client.makeServerStreamRequest<{ sessionId: string; commandId: string; follow: boolean }, LogChunk>(
      method.path,
      method.requestSerialize,
      method.responseDeserialize,
      { sessionId, commandId, follow: true },
      md,
    );
    let stdout = "";
    let stderr = "";
    for await (const chunk of stream as AsyncIterable<LogChunk>) {
      if (chunk.stdout) stdout += chunk.stdout.toString();
      if (chunk.stderr) stderr += chunk.stderr.toString();
    }
    return { stdout, stderr };
  } finally {
    client.close();
  }
}

type GrpcNode = grpc.GrpcObject[string];
/** A package of the loaded definition (not a message or enum type, which carry their descriptors). */
const isPackage = (n: GrpcNode): n is grpc.GrpcObject => typeof n === "object" && n !== null && !("fileDescriptorProtos" in n);

/** The client constructor of the service at a dotted name of a loaded package definition. */
function serviceAt(root: grpc.GrpcObject, name: string): grpc.ServiceClientConstructor {
  let node: GrpcNode = root;
  for (const part of name.split(".")) {
    if (!isPackage(node)) throw new Error(`${name}: no package holds ${part}`);
    node = node[part];
  }
  if (typeof node !== "function") throw new Error(`${name} is not a service of the loaded definition`);
  return node;
}

/** CommonJS packages (the SDKs) from this ES module. */
export const load = <T>(specifier: string): T => createRequire(import.meta.url)(specifier) as T;

/** Saves the test registry's credentials through the registries API, as a user gives them, so snapshot pulls and builds use them. */
export async function saveRegistry(s: RealServer, reg: TestRegistry): Promise<void> {
  const saved = await fetch(`${s.apiUrl}/docker-registry`, {
    method: "POST",
    headers: { authorization: `Bearer ${s.adminKey}`, "content-type": "application/json" },
    body: JSON.stringify({ name: "test registry", url: `http://${reg.host}`, username: reg.username, password: reg.password }),
  });
  expect(saved.status, await saved.clone().text()).toBe(201);
}
