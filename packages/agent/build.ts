/**
 * Bundles the agent for the runner to bind-mount (read-only, beside a node
 * binary) into sandboxes: dist/agent.mjs is the entry (it turns on Node's
 * compile cache in dist/compile-cache, made here by running the agent once:
 * see compile-cache.ts), dist/main.mjs the agent (what starts it and serves),
 * dist/chunks/ the services, each loaded on its first call. What
 * cannot be bundled is copied into dist/node_modules: node-pty (a native
 * addon) and typescript-language-server with the typescript it runs (separate
 * processes). Mount the whole dist directory and run agent.mjs.
 * Usage: node packages/agent/build.ts [outDir]
 */
import { cp, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import type { Plugin } from "esbuild";
import { AGENT_MAIN, buildCompileCache, LOADER } from "./compile-cache.ts";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);

/** A package's root directory, resolved from the agent's own dependencies. */
function packageDir(name: string): string {
  return path.dirname(require.resolve(`${name}/package.json`));
}

/** Copies the listed parts of a package into outDir/node_modules/<name>. */
async function copyPackage(outDir: string, name: string, parts: string[]): Promise<void> {
  const from = packageDir(name);
  const to = path.join(outDir, "node_modules", name);
  await mkdir(to, { recursive: true });
  for (const part of ["package.json", ...parts]) await cp(path.join(from, part), path.join(to, part), { recursive: true });
}

/**
 * Connect's compression module loads zlib when it is evaluated, though the
 * agent never compresses (it accepts no compression): give it a zlib that
 * loads on first use, so startup does not pay for it.
 */
const lazyZlib: Plugin = {
  name: "lazy-zlib",
  setup(b) {
    b.onResolve({ filter: /^(node:)?zlib$/ }, (args) =>
      /@connectrpc[\\/]connect-node/.test(args.importer) ? { path: "lazy-zlib", namespace: "lazy-zlib" } : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: "lazy-zlib" }, () => ({
      loader: "js",
      contents: [
        'import { createRequire } from "node:module";',
        "const load = createRequire(import.meta.url);",
        "let z;",
        'const zlib = () => (z ??= load("node:zlib"));',
        ...["gzip", "gunzip", "brotliCompress", "brotliDecompress"].map((f) => `export function ${f}(...a) { return zlib().${f}(...a); }`),
      ].join("\n"),
    }));
  },
};

export async function buildAgent(outDir = path.join(here, "dist")): Promise<string> {
  await rm(outDir, { recursive: true, force: true });
  await mkdir(outDir, { recursive: true });
  const outfile = path.join(outDir, "agent.mjs");
  await build({
    entryPoints: { [path.basename(AGENT_MAIN, ".mjs")]: path.join(here, "src", "main.ts") },
    outdir: outDir,
    outExtension: { ".js": ".mjs" },
    // Each service is a chunk loaded on its first call, with the builtins it needs.
    splitting: true,
    chunkNames: "chunks/[name]-[hash]",
    plugins: [lazyZlib],
    // Every use of the global Headers (Connect's) gets a lean one: Node's loads undici.
    inject: [path.join(here, "src", "util", "lean-headers.ts")],
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node22",
    minify: process.env.SANDBAR_AGENT_NO_MINIFY !== "1",
    sourcemap: "linked",
    legalComments: "none",
    external: ["node-pty", "typescript-language-server", "typescript"],
    logLevel: "warning",
  });
  await copyPackage(outDir, "node-pty", ["lib", "build/Release/pty.node", "LICENSE"]);
  await copyPackage(outDir, "typescript-language-server", ["lib", "LICENSE"]);
  await copyPackage(outDir, "typescript", ["lib", "LICENSE.txt"]);
  await writeFile(outfile, LOADER, { mode: 0o755 });
  if (process.env.SANDBAR_AGENT_NO_COMPILE_CACHE !== "1") await buildCompileCache(outDir);
  return outfile;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const outfile = await buildAgent(process.argv[2] ? path.resolve(process.argv[2]) : undefined);
  const main = path.join(path.dirname(outfile), AGENT_MAIN);
  const size = (await readFile(main)).length;
  process.stdout.write(`${outfile} (the agent: ${main}, ${(size / 1024).toFixed(0)} KiB)\n`);
}
