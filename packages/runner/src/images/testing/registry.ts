import { spawn, type ChildProcess } from "node:child_process";
import { createHash, createPrivateKey, createSign, randomBytes, X509Certificate } from "node:crypto";
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { gzipSync } from "node:zlib";
import { create as tarCreate, Header } from "tar";
import { freePort } from "../../free-port.ts";

// A real OCI registry on loopback for tests and benchmarks: Debian's docker-registry (CNCF
// distribution 2.8) with htpasswd basic auth and storage in a temp dir, seeded by images built
// from files (an OCI layout written here, pushed with skopeo). No network beyond 127.0.0.1.

export interface TestRegistry {
  /** "127.0.0.1:<port>" */
  host: string;
  username: string;
  password: string;
  dir: string;
  /** Pushes image `name` of an OCI layout to <host>/<repo>; returns the pushed manifest digest. */
  push(layout: string, name: string, repo: string): Promise<string>;
  stop(): Promise<void>;
}

function run(cmd: string, args: string[], stdin?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ["pipe", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (c: Buffer) => (out += c.toString()));
    child.stderr.on("data", (c: Buffer) => (err += c.toString()));
    child.on("error", reject);
    child.on("close", (code) => (code === 0 ? resolve(out) : reject(new Error(`${cmd} ${args[0]} failed (${code}): ${err.trim()}`))));
    child.stdin.end(stdin ?? "");
  });
}

export interface RegistryOptions {
  username?: string;
  password?: string;
  /**
   * "basic": htpasswd. "token": Docker Hub's scheme: the registry answers 401 with a Bearer
   * challenge naming a token service (served here, checking the same user and password) whose
   * signed JWT the client then presents.
   */
  auth?: "basic" | "token";
}

export async function startRegistry(options: RegistryOptions = {}): Promise<TestRegistry> {
  const username = options.username ?? "tester";
  const password = options.password ?? `pw-${createHash("sha256").update(String(Math.random())).digest("hex").slice(0, 16)}`;
  const dir = await mkdtemp(path.join(os.tmpdir(), "sandbar-registry-"));
  const port = await freePort();
  const host = `127.0.0.1:${port}`;
  let auth: string;
  let tokenServer: TokenServer | undefined;
  if (options.auth === "token") {
    tokenServer = await startTokenServer(dir, username, password);
    auth = `auth: {token: {realm: "${tokenServer.realm}", service: ${TOKEN_SERVICE}, issuer: ${TOKEN_ISSUER}, rootcertbundle: ${tokenServer.cert}}}`;
  } else {
    // bcrypt as distribution requires; the password goes through stdin, not argv.
    const htpasswd = await run("htpasswd", ["-niB", username], password);
    await writeFile(path.join(dir, "htpasswd"), htpasswd, { mode: 0o600 });
    auth = `auth: {htpasswd: {realm: sandbar-test, path: ${path.join(dir, "htpasswd")}}}`;
  }
  await writeFile(
    path.join(dir, "config.yml"),
    [
      "version: 0.1",
      "log: {level: error, accesslog: {disabled: true}}",
      `storage: {filesystem: {rootdirectory: ${path.join(dir, "data")}}, delete: {enabled: true}}`,
      `http: {addr: "${host}", secret: "test-secret"}`,
      auth,
      "",
    ].join("\n"),
  );
  const child: ChildProcess = spawn("docker-registry", ["serve", path.join(dir, "config.yml")], { stdio: ["ignore", "ignore", "pipe"] });
  // A test runner that dies must not leave the registry behind.
  const killOnExit = () => child.kill("SIGKILL");
  process.once("exit", killOnExit);
  let stderr = "";
  child.stderr?.on("data", (c: Buffer) => (stderr = (stderr + c.toString()).slice(-4000)));
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (child.exitCode !== null) {
      await tokenServer?.stop();
      throw new Error(`docker-registry exited: ${stderr.trim()}`);
    }
    const res = await fetch(`http://${host}/v2/`).catch(() => undefined);
    if (res?.status === 401) break;
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`docker-registry did not answer on ${host}: ${stderr.trim()}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  const authfile = path.join(dir, "auth.json");
  await writeFile(authfile, JSON.stringify({ auths: { [host]: { auth: Buffer.from(`${username}:${password}`).toString("base64") } } }), { mode: 0o600 });
  return {
    host,
    username,
    password,
    dir,
    async push(layout, name, repo) {
      const digestFile = path.join(dir, `digest-${process.pid}-${Math.random().toString(36).slice(2)}`);
      await run("skopeo", ["copy", "--quiet", "--all", "--authfile", authfile, "--dest-tls-verify=false", "--digestfile", digestFile, `oci:${layout}:${name}`, `docker://${host}/${repo}`]);
      const digest = (await readFile(digestFile, "utf8")).trim();
      await rm(digestFile, { force: true });
      return digest;
    },
    async stop() {
      process.removeListener("exit", killOnExit);
      await tokenServer?.stop();
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        await exited;
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
}

// ---- a token service (Docker Hub's auth flow) ------------------------------------------------

const TOKEN_SERVICE = "sandbar-test-registry";
const TOKEN_ISSUER = "sandbar-test-issuer";

interface TokenServer {
  realm: string;
  cert: string;
  stop(): Promise<void>;
}

const b64url = (b: Buffer | string) => Buffer.from(b).toString("base64url");

async function startTokenServer(dir: string, username: string, password: string): Promise<TokenServer> {
  const key = path.join(dir, "token-key.pem");
  const cert = path.join(dir, "token-cert.pem");
  await run("openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=sandbar-test-token"]);
  const privateKey = createPrivateKey(await readFile(key));
  const der = new X509Certificate(await readFile(cert)).raw;
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://token");
    const given = /^Basic (.+)$/.exec(req.headers.authorization ?? "")?.[1];
    if (url.pathname !== "/token" || given !== Buffer.from(`${username}:${password}`).toString("base64")) {
      res.writeHead(401, { "content-type": "application/json" }).end(JSON.stringify({ details: "incorrect username or password" }));
      return;
    }
    const access = url.searchParams.getAll("scope").flatMap((scope) => {
      const [type, ...rest] = scope.split(":");
      const actions = rest.pop() ?? "";
      return [{ type, name: rest.join(":"), actions: actions.split(",").filter(Boolean) }];
    });
    const now = Math.floor(Date.now() / 1000);
    const header = { alg: "RS256", typ: "JWT", x5c: [der.toString("base64")] };
    const claims = { iss: TOKEN_ISSUER, sub: username, aud: url.searchParams.get("service"), exp: now + 300, nbf: now - 10, iat: now, jti: randomBytes(8).toString("hex"), access };
    const signingInput = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`;
    const token = `${signingInput}.${b64url(createSign("RSA-SHA256").update(signingInput).sign(privateKey))}`;
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ token, access_token: token, expires_in: 300 }));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    realm: `http://127.0.0.1:${port}/token`,
    cert,
    stop: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

// ---- OCI layouts from files ------------------------------------------------------------------

export interface LayerBlob {
  /** gzip of the tar */
  blob: Buffer;
  digest: string;
  diffId: string;
}

const sha = (b: Buffer) => `sha256:${createHash("sha256").update(b).digest("hex")}`;

export function layerFromTar(tar: Buffer): LayerBlob {
  const blob = gzipSync(tar);
  return { blob, digest: sha(blob), diffId: sha(tar) };
}

/** A layer holding `files` (path -> content; a trailing "/" makes a directory; ".wh." names are whiteouts). */
export async function layerFromFiles(files: Record<string, string | Buffer | { content: string; mode: number }>, scratch: string): Promise<LayerBlob> {
  const dir = await mkdtemp(path.join(scratch, "layer-"));
  await chmod(dir, 0o755);
  for (const [rel, value] of Object.entries(files)) {
    const p = path.join(dir, rel);
    if (rel.endsWith("/")) await mkdir(p, { recursive: true });
    else {
      await mkdir(path.dirname(p), { recursive: true });
      const content = typeof value === "object" && !Buffer.isBuffer(value) ? value.content : value;
      await writeFile(p, content);
      if (typeof value === "object" && !Buffer.isBuffer(value)) await chmod(p, value.mode);
    }
  }
  const chunks: Buffer[] = [];
  const stream = tarCreate({ cwd: dir, noMtime: true }, ["."]); // not "portable": it rewrites modes
  for await (const c of stream as AsyncIterable<Buffer>) chunks.push(c);
  await rm(dir, { recursive: true, force: true });
  return layerFromTar(Buffer.concat(chunks));
}

/** A layer holding the tree at `dir` as it is (owners, modes, symlinks). */
export async function layerFromDir(dir: string): Promise<LayerBlob> {
  const chunks: Buffer[] = [];
  for await (const c of tarCreate({ cwd: dir, noMtime: true }, ["."]) as AsyncIterable<Buffer>) chunks.push(c);
  return layerFromTar(Buffer.concat(chunks));
}

export interface RawMember {
  path: string;
  type?: "File" | "Directory" | "SymbolicLink" | "Link" | "CharacterDevice";
  content?: string;
  linkpath?: string;
  size?: number;
}

/** A tar written member by member, as a hostile image would: no path checks at all. */
export function rawTar(members: RawMember[]): Buffer {
  const parts: Buffer[] = [];
  for (const m of members) {
    const body = Buffer.from(m.content ?? "");
    const type = m.type ?? "File";
    const h = new Header({ path: m.path, mode: type === "Directory" ? 0o755 : 0o644, uid: 0, gid: 0, size: type === "File" ? (m.size ?? body.length) : 0, mtime: new Date(0), type, linkpath: m.linkpath ?? "" });
    const block = Buffer.alloc(512);
    h.encode(block, 0);
    parts.push(block);
    if (type === "File") {
      const size = m.size ?? body.length;
      const padded = Buffer.alloc(Math.ceil(size / 512) * 512);
      body.copy(padded);
      parts.push(padded);
    }
  }
  parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

export interface ImageSpec {
  layers: LayerBlob[];
  env?: string[];
  workdir?: string;
  cmd?: string[];
  entrypoint?: string[];
  user?: string;
  architecture?: string;
}

async function putBlob(layout: string, data: Buffer): Promise<{ digest: string; size: number }> {
  const digest = sha(data);
  await writeFile(path.join(layout, "blobs", "sha256", digest.slice(7)), data);
  return { digest, size: data.length };
}

async function index(layout: string): Promise<{ schemaVersion: 2; manifests: unknown[] }> {
  return JSON.parse(await readFile(path.join(layout, "index.json"), "utf8")) as { schemaVersion: 2; manifests: unknown[] };
}

export async function initLayout(layout: string): Promise<void> {
  await mkdir(path.join(layout, "blobs", "sha256"), { recursive: true });
  await writeFile(path.join(layout, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
  await writeFile(path.join(layout, "index.json"), JSON.stringify({ schemaVersion: 2, manifests: [] }));
}

async function writeManifest(layout: string, spec: ImageSpec): Promise<{ digest: string; size: number }> {
  const config = {
    architecture: spec.architecture ?? "amd64",
    os: "linux",
    config: { Env: spec.env ?? [], WorkingDir: spec.workdir ?? "", Cmd: spec.cmd, Entrypoint: spec.entrypoint, User: spec.user ?? "" },
    rootfs: { type: "layers", diff_ids: spec.layers.map((l) => l.diffId) },
  };
  const cfg = await putBlob(layout, Buffer.from(JSON.stringify(config)));
  const layers = [];
  for (const l of spec.layers) {
    await putBlob(layout, l.blob);
    layers.push({ mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: l.digest, size: l.blob.length });
  }
  const manifest = { schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json", config: { mediaType: "application/vnd.oci.image.config.v1+json", ...cfg }, layers };
  return putBlob(layout, Buffer.from(JSON.stringify(manifest)));
}

async function tagInIndex(layout: string, name: string, desc: Record<string, unknown>): Promise<void> {
  const idx = await index(layout);
  idx.manifests = idx.manifests.filter((m) => (m as { annotations?: Record<string, string> }).annotations?.["org.opencontainers.image.ref.name"] !== name);
  idx.manifests.push({ ...desc, annotations: { "org.opencontainers.image.ref.name": name } });
  await writeFile(path.join(layout, "index.json"), JSON.stringify(idx));
}

/** Adds image `name` to the layout; returns its manifest digest. */
export async function addImage(layout: string, name: string, spec: ImageSpec): Promise<string> {
  const m = await writeManifest(layout, spec);
  await tagInIndex(layout, name, { mediaType: "application/vnd.oci.image.manifest.v1+json", ...m });
  return m.digest;
}

/** Adds a multi-platform index `name` (one image per architecture); returns the digests. */
export async function addIndex(layout: string, name: string, byArch: Record<string, ImageSpec>): Promise<{ index: string; manifests: Record<string, string> }> {
  const manifests: Record<string, string> = {};
  const entries = [];
  for (const [arch, spec] of Object.entries(byArch)) {
    const m = await writeManifest(layout, { ...spec, architecture: arch });
    manifests[arch] = m.digest;
    entries.push({ mediaType: "application/vnd.oci.image.manifest.v1+json", ...m, platform: { architecture: arch, os: "linux" } });
  }
  const idx = await putBlob(layout, Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: entries })));
  await tagInIndex(layout, name, { mediaType: "application/vnd.oci.image.index.v1+json", ...idx });
  return { index: idx.digest, manifests };
}

// ---- the standard test images ---------------------------------------------------------------

export interface SeededImages {
  /** base + app layer: /app/hello.txt, /app/notes.txt (mode 0666), /etc/greeting, env GREETING and APP_MODE, workdir /app. */
  app: string;
  /** base + a layer with files + a layer deleting /data/gone (whiteout) and making /opq opaque. */
  whiteout: string;
  /** The shared base layer's diff id. */
  baseDiffId: string;
  appDigest: string;
  /** The OCI layout the images were built in (images "app", "whiteout"), to push elsewhere. */
  layout: string;
}

/**
 * Pushes two images sharing a base layer to `registry` (repos test/app:1.0 and test/whiteout:1.0).
 * `baseLayer` replaces the small default base (e.g. a host-/usr skeleton rootfs, to boot sandboxes).
 */
export async function seedImages(registry: TestRegistry, scratch: string, baseLayer?: LayerBlob): Promise<SeededImages> {
  const layout = path.join(scratch, "layout");
  await initLayout(layout);
  const base = baseLayer ?? (await layerFromFiles({ "etc/os-release": "ID=sandbar-test\n", "etc/base.txt": "base layer\n" }, scratch));
  const app = await layerFromFiles({ "app/hello.txt": "hello from the image\n", "app/notes.txt": { content: "notes\n", mode: 0o666 }, "etc/greeting": "hi\n" }, scratch);
  const data = await layerFromFiles({ "data/keep": "kept\n", "data/gone": "to be deleted\n", "opq/old1": "old\n", "opq/sub/old2": "old\n" }, scratch);
  const del = await layerFromFiles({ "data/.wh.gone": "", "opq/.wh..wh..opq": "", "opq/new": "new\n" }, scratch);
  await addImage(layout, "app", { layers: [base, app], env: ["GREETING=hello world", "APP_MODE=test", "PATH=/usr/local/bin:/usr/bin:/bin"], workdir: "/app", cmd: ["cat", "/app/hello.txt"] });
  await addImage(layout, "whiteout", { layers: [base, data, del] });
  const appDigest = await registry.push(layout, "app", "test/app:1.0");
  await registry.push(layout, "whiteout", "test/whiteout:1.0");
  return { app: `${registry.host}/test/app:1.0`, whiteout: `${registry.host}/test/whiteout:1.0`, baseDiffId: base.diffId, appDigest, layout };
}
