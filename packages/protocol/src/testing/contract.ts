// The contract as generated code: every file of a package found on disk, its services and their
// REST bindings (google.api.http rules), for the contract tests.

import { readdirSync } from "node:fs";
import { getOption, hasOption } from "@bufbuild/protobuf";
import type { DescFile, DescMethod, DescService } from "@bufbuild/protobuf";
import { http } from "@sandbar/protocol/gen/google/api/annotations_pb.js";
import type { HttpRule } from "@sandbar/protocol/gen/google/api/http_pb.js";
import { route } from "@sandbar/protocol/gen/sandbar/options/v1/options_pb.js";
import { type HttpMethod, shape } from "./spec-tables.ts";

export interface Binding {
  readonly method: HttpMethod;
  readonly path: string;
  readonly body: string;
  readonly responseBody: string;
  readonly rpc: DescMethod;
}

export function variables(path: string): string[] {
  return [...path.matchAll(/\{([^}=]*)/g)].map((m) => m[1] ?? "");
}

const verbs: Record<string, HttpMethod> = { get: "GET", post: "POST", put: "PUT", patch: "PATCH", delete: "DELETE" };

export function bindingsOf(rpc: DescMethod, rule: HttpRule): Binding[] {
  const { pattern } = rule;
  const out: Binding[] = [];
  if (pattern.case !== undefined && pattern.case !== "custom") {
    const method = verbs[pattern.case];
    if (method) out.push({ method, path: pattern.value, body: rule.body, responseBody: rule.responseBody, rpc });
  }
  for (const extra of rule.additionalBindings) out.push(...bindingsOf(rpc, extra));
  return out;
}

function isDescFile(value: unknown): value is DescFile {
  return typeof value === "object" && value !== null && (value as { kind?: unknown }).kind === "file";
}

/** Every generated file of sandbar.<pkg>.v1, found on disk so new files are covered too. */
async function loadFiles(pkg: string): Promise<DescFile[]> {
  const dir = new URL(`../../gen/sandbar/${pkg}/v1/`, import.meta.url);
  const names = readdirSync(dir).filter((n) => n.endsWith("_pb.js")).sort();
  const files: DescFile[] = [];
  for (const name of names) {
    const mod: Record<string, unknown> = await import(`@sandbar/protocol/gen/sandbar/${pkg}/v1/${name}`);
    files.push(...Object.values(mod).filter(isDescFile));
  }
  return files;
}

export function servicesOf(files: DescFile[], pkg: string): DescService[] {
  return files.filter((f) => f.proto.package === pkg).flatMap((f) => f.services);
}

function bindingsOfServices(services: DescService[]): Binding[] {
  return services.flatMap((s) => s.methods.flatMap((m) => (hasOption(m, http) ? bindingsOf(m, getOption(m, http)) : [])));
}

export const statusOf = (rpc: DescMethod): number => getOption(rpc, route).status || 200;
export const label = (b: Binding): string => `${b.method} ${b.path} (${b.rpc.parent.name}.${b.rpc.name})`;

export const controlFiles = await loadFiles("control");
export const controlServices = servicesOf(controlFiles, "sandbar.control.v1");
export const controlBindings = bindingsOfServices(controlServices);
export const agentFiles = await loadFiles("agent");
export const agentBindings = bindingsOfServices(servicesOf(agentFiles, "sandbar.agent.v1"));
export const runnerFiles = await loadFiles("runner");

export function servedBy(bindings: Binding[], method: HttpMethod, path: string): Binding[] {
  return bindings.filter((b) => b.method === method && shape(b.path) === shape(path));
}
