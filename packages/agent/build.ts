/**
 * Bundles the agent for the runner to bind-mount (read-only, beside a node
 * binary) into sandboxes: dist/agent.mjs is the entry (it turns on Node's
 * compile cache in dist/compile-cache, made here by running the agent once:
 * see compile-cache.ts), dist/main.mjs the agent (what starts it and serves),
 * dist/chunks/ the services, each loaded on its first call. What
 * cannot be bundled is copied into dist/node_modules: node-pty (a native
 * addon) and typescript-language-server with the typescript it runs (separate
 * processes). Mount the whole dist directory and run agent.mjs.
 * Beside them, agent-<node version>-<arch>.blob: the agent as a V8 startup
 * snapshot for the node that built it (snapshot-blob.ts, src/snapshot.ts),
 * which that node runs instead of loading agent.mjs.
 * Usage: node packages/agent/build.ts [outDir]
 */
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { createRequire } from "node:module";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import type { Plugin } from "esbuild";
import { AGENT_MAIN, buildCompileCache, LOADER } from "./compile-cache.ts";
import { buildSnapshotBlob } from "./snapshot-blob.ts";

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
        "let z;",
        'const zlib = () => (z ??= process.getBuiltinModule("node:zlib"));',
        ...["gzip", "gunzip", "brotliCompress", "brotliDecompress"].map((f) => `export function ${f}(...a) { return zlib().${f}(...a); }`),
      ].join("\n"),
    }));
  },
};

/**
 * In the snapshot, node-pty (a native addon, outside the bundle) is required on
 * the first terminal from the bundle's node_modules where the sandbox sees it:
 * a snapshot's own require loads only built-in modules.
 */
const nodePtyAtRunTime: Plugin = {
  name: "node-pty-at-run-time",
  setup(b) {
    b.onResolve({ filter: /^node-pty$/ }, () => ({ path: "node-pty", namespace: "node-pty-at-run-time" }));
    b.onLoad({ filter: /.*/, namespace: "node-pty-at-run-time" }, () => ({
      loader: "js",
      contents: [
        'import { createRequire } from "node:module";',
        'const pty = createRequire(import.meta.url)("node-pty");',
        "export const spawn = pty.spawn;",
      ].join("\n"),
    }));
  },
};

/** The snapshot's entry, bundled into one CommonJS script (what `--build-snapshot` takes). */
async function bundleSnapshotEntry(outfile: string): Promise<void> {
  await build({
    entryPoints: [path.join(here, "src", "snapshot.ts")],
    outfile,
    plugins: [lazyZlib, nodePtyAtRunTime],
    inject: [path.join(here, "src", "grpc-wire", "lean-headers.ts"), path.join(here, "src", "util", "snapshot-url.ts")],
    // import.meta.url is where the snapshot runs from (set when it starts), not where it was built.
    define: { "import.meta.url": "agentEntryUrl" },
    bundle: true,
    platform: "node",
    format: "cjs",
    target: "node22",
    minify: process.env.SANDBAR_AGENT_NO_MINIFY !== "1",
    legalComments: "none",
    external: ["typescript-language-server", "typescript"],
    logLevel: "warning",
  });
}

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
    inject: [path.join(here, "src", "grpc-wire", "lean-headers.ts")],
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
  if (process.env.SANDBAR_AGENT_NO_SNAPSHOT !== "1") {
    const scratch = await mkdtemp(path.join(tmpdir(), "sandbar-agent-snapshot-"));
    try {
      const entry = path.join(scratch, "snapshot.cjs");
      await bundleSnapshotEntry(entry);
      await buildSnapshotBlob(entry, outDir);
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
  }
  return outfile;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const outfile = await buildAgent(process.argv[2] ? path.resolve(process.argv[2]) : undefined);
  const main = path.join(path.dirname(outfile), AGENT_MAIN);
  const size = (await readFile(main)).length;
  process.stdout.write(`${outfile} (the agent: ${main}, ${(size / 1024).toFixed(0)} KiB)\n`);
}
