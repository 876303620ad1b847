// Package hygiene, part of `npm test`'s lint step: every package has a version and declares
// (in dependencies, devDependencies or peerDependencies) each package its sources import. A
// package resolving only because another workspace or the root installed it breaks as soon
// as it is installed or published alone. The root's own sources are test/ and bench/. The test
// tools every package shares are declared once, at the root (SHARED_TOOLS).
import { readdirSync, readFileSync, statSync } from "node:fs";
import { builtinModules } from "node:module";
import path from "node:path";
import ts from "typescript";

const root = path.resolve(import.meta.dirname, "..");
const builtins = new Set(builtinModules);

interface Manifest {
  name: string;
  version?: string;
  dependencies?: Record<string, string>;
  devDependencies?: Record<string, string>;
  peerDependencies?: Record<string, string>;
}

function sourceFiles(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir)) {
    if (entry === "node_modules" || entry === "dist" || entry === "gen") continue;
    const p = path.join(dir, entry);
    if (statSync(p).isDirectory()) out.push(...sourceFiles(p));
    else if (/\.(ts|mts|js|mjs)$/.test(entry) && !entry.endsWith(".d.ts")) out.push(p);
  }
  return out;
}

/** The package a bare specifier names ("@scope/name/sub" -> "@scope/name"), or undefined for files and built-ins. */
function packageOf(specifier: string): string | undefined {
  if (specifier.startsWith(".") || specifier.startsWith("/") || specifier.startsWith("node:") || builtins.has(specifier)) return undefined;
  const parts = specifier.split("/");
  return specifier.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0];
}

const workspaces: { dir: string; sources: string[] }[] = [
  { dir: root, sources: ["test", "bench"] },
  ...readdirSync(path.join(root, "packages")).map((p) => ({ dir: path.join(root, "packages", p), sources: ["."] })),
];

const SHARED_TOOLS = ["vitest", "@grpc/grpc-js", "@grpc/proto-loader"];
const problems: string[] = [];
for (const { dir, sources } of workspaces) {
  const manifestPath = path.join(dir, "package.json");
  const manifest: Manifest = JSON.parse(readFileSync(manifestPath, "utf8"));
  const where = path.relative(root, manifestPath);
  if (!manifest.version) problems.push(`${where}: no "version"`);
  const declared = new Set([manifest.name, ...SHARED_TOOLS, ...Object.keys({ ...manifest.dependencies, ...manifest.devDependencies, ...manifest.peerDependencies })]);
  const missing = new Map<string, string>();
  for (const file of sources.flatMap((s) => sourceFiles(path.join(dir, s)))) {
    for (const ref of ts.preProcessFile(readFileSync(file, "utf8"), true, true).importedFiles) {
      const name = packageOf(ref.fileName);
      if (name && !declared.has(name) && !missing.has(name)) missing.set(name, path.relative(root, file));
    }
  }
  for (const [name, file] of missing) problems.push(`${where}: imports ${name} (${file}) without declaring it`);
}
for (const p of problems) console.log(p);
process.exit(problems.length ? 1 : 0);
