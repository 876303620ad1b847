import { chmod, copyFile, mkdir, realpath } from "node:fs/promises";
import path from "node:path";
import { addImage, initLayout, layerFromDir, layerFromFiles, type TestRegistry } from "../../../../runner/src/images/testing/registry.ts";
import type { CredentialsFor } from "../credentials-for.ts";

// An image a sandbox can boot from, pushed to a test registry: a minimal glibc userland copied
// from this host (the loader, node's libraries, sh, cat, env, id) and a layer of files. An image
// sandbox gets no host binds, so the agent (the host's node) needs those libraries in the image.

/** What the test image holds (files, env) for assertions. */
const TEST_IMAGE = {
  files: { "app/hello.txt": "hello from the image\n", "etc/greeting": "hi\n" },
  env: ["GREETING=hello world", "APP_MODE=image", "PATH=/usr/local/bin:/usr/bin:/bin"],
  entrypoint: ["/bin/sh"],
};

async function minimalUserland(dir: string): Promise<void> {
  const files = ["/lib64/ld-linux-x86-64.so.2", "/etc/ld.so.cache", "/bin/sh", "/bin/cat", "/usr/bin/env", "/usr/bin/id"];
  for (const lib of ["libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "libstdc++.so.6", "libgcc_s.so.1", "libselinux.so.1", "libpcre2-8.so.0"]) files.push(`/lib/x86_64-linux-gnu/${lib}`);
  for (const f of files) {
    const source = await realpath(f).catch(() => undefined);
    if (!source) continue; // libselinux/pcre2 are only id's, where present
    await mkdir(path.join(dir, path.dirname(f)), { recursive: true, mode: 0o755 });
    await copyFile(source, path.join(dir, f));
  }
  for (const d of ["home", "etc"]) await mkdir(path.join(dir, d), { recursive: true, mode: 0o755 });
  await mkdir(path.join(dir, "tmp"));
  await chmod(path.join(dir, "tmp"), 0o1777); // as images have it: the agent keeps its state there
}

/**
 * Pushes the test image as `<registry>/<repo>`; answers the reference to pull. `extra` adds files
 * to its top layer and sets its USER. Each call needs a scratch dir of its own.
 */
export async function pushTestImage(reg: TestRegistry, scratch: string, repo = "test/app:1.0", extra: { user?: string; files?: Record<string, string> } = {}): Promise<string> {
  const root = path.join(scratch, "userland");
  await minimalUserland(root);
  const layout = path.join(scratch, "layout");
  await initLayout(layout);
  const base = await layerFromDir(root);
  const files = await layerFromFiles({ ...TEST_IMAGE.files, ...extra.files }, scratch);
  await addImage(layout, "app", { layers: [base, files], env: TEST_IMAGE.env, workdir: "/app", entrypoint: TEST_IMAGE.entrypoint, cmd: ["-c", "sleep infinity"], user: extra.user });
  await reg.push(layout, "app", repo);
  return `${reg.host}/${repo}`;
}

/** The registries API's lookup as a test stands it in: this registry's account for every organization. */
export function registryAccount(reg: TestRegistry): CredentialsFor {
  const credentials = { username: reg.username, password: reg.password };
  return async (_org, host) => (host === reg.host ? credentials : undefined);
}
