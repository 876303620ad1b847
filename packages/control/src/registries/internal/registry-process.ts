import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes, X509Certificate } from "node:crypto";
import { access, chmod, mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";

// Debian's docker-registry (CNCF distribution) as a child of the server: storage, config and the
// token-signing key under `<data dir>/registry`, listening on loopback, token auth against our
// token service. Stopped with the server.

export const REGISTRY_SERVICE = "sandbar-internal-registry";
export const TOKEN_ISSUER = "sandbar";

export interface SigningKey {
  keyPem: string;
  certDer: Buffer;
  certPath: string;
}

function run(cmd: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    child.stderr.on("data", (c: Buffer) => (err = (err + c.toString()).slice(-2000)));
    child.on("error", (e) => reject(new Error(`cannot run ${cmd}: ${e.message}`)));
    child.on("close", (code) => (code === 0 ? resolve() : reject(new Error(`${cmd} failed (${code}): ${err.trim()}`))));
  });
}

/** The token-signing key and its self-signed certificate, made once (openssl) and kept. */
export async function signingKey(dir: string): Promise<SigningKey> {
  const keyPath = path.join(dir, "token.key");
  const certPath = path.join(dir, "token.crt");
  const exists = await access(certPath).then(
    () => true,
    () => false,
  );
  if (!exists) {
    await run("openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", keyPath, "-out", certPath, "-days", "36500", "-subj", "/CN=sandbar internal registry tokens"]);
  }
  await chmod(keyPath, 0o600);
  return { keyPem: await readFile(keyPath, "utf8"), certDer: new X509Certificate(await readFile(certPath)).raw, certPath };
}

export interface RegistryProcess {
  /** The running registry's pid (a new one after a restart). */
  readonly pid: number;
  stop(): Promise<void>;
}

/** Waits before restarting a registry that died: doubling from 1 s to 30 s, back to 1 s once it ran a minute. */
const RESTART_DELAY = { first: 1_000, max: 30_000, stableMs: 60_000 };

/** Spawns docker-registry and waits until it answers; the child, or an error saying why not. */
async function launch(config: string, address: string, log: (line: string) => void): Promise<ChildProcess> {
  // setpriv's parent-death signal takes the registry down with the server even when the server is
  // SIGKILLed (no exit handler runs then); it execs docker-registry, so the pid is the registry's.
  const child: ChildProcess = spawn("setpriv", ["--pdeathsig", "KILL", "docker-registry", "serve", config], { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr?.on("data", (c: Buffer) => (stderr = (stderr + c.toString()).slice(-4000)));
  const spawnError = new Promise<Error>((resolve) => child.once("error", resolve));
  // The server exiting must not leave the registry behind.
  const killOnExit = () => child.kill("SIGKILL");
  process.once("exit", killOnExit);
  child.once("exit", () => process.removeListener("exit", killOnExit));
  const deadline = Date.now() + 15_000;
  for (;;) {
    const failed = await Promise.race([spawnError, new Promise<undefined>((r) => setTimeout(() => r(undefined), 25))]);
    if (failed) throw new Error(`cannot run setpriv (util-linux): ${failed.message}`);
    // setpriv answers 127 when it cannot exec docker-registry.
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`docker-registry exited (${child.exitCode === 127 ? "install Debian's docker-registry package" : (child.signalCode ?? `status ${child.exitCode}`)}): ${stderr.trim().slice(-500)}`);
    }
    const res = await fetch(`http://${address}/v2/`).catch(() => undefined);
    if (res?.status === 401) break;
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`docker-registry did not answer on ${address}: ${stderr.trim().slice(-500)}`);
    }
  }
  child.once("exit", (code, signal) => log(`internal registry: docker-registry exited (${signal ?? code}): ${stderr.trim().slice(-500)}`));
  return child;
}

export async function startRegistryProcess(o: { dir: string; address: string; realm: string; certPath: string; log: (line: string) => void }): Promise<RegistryProcess> {
  const data = path.join(o.dir, "data");
  await mkdir(data, { recursive: true, mode: 0o700 });
  const config = path.join(o.dir, "config.yml");
  await writeFile(
    config,
    [
      "version: 0.1",
      "log: {level: error, accesslog: {disabled: true}}",
      `storage: {filesystem: {rootdirectory: ${JSON.stringify(data)}}, delete: {enabled: true}}`,
      `http: {addr: ${JSON.stringify(o.address)}, secret: ${JSON.stringify(randomBytes(24).toString("hex"))}}`,
      `auth: {token: {realm: ${JSON.stringify(o.realm)}, service: ${REGISTRY_SERVICE}, issuer: ${TOKEN_ISSUER}, rootcertbundle: ${JSON.stringify(o.certPath)}}}`,
      "",
    ].join("\n"),
    { mode: 0o600 },
  );
  let child = await launch(config, o.address, o.log);
  let stopping = false;
  let delay = RESTART_DELAY.first;
  let timer: NodeJS.Timeout | undefined;
  // A registry that dies is started again (its storage is on disk), after a growing pause.
  const supervise = (c: ChildProcess, startedAt: number) =>
    c.once("exit", () => {
      if (stopping) return;
      if (Date.now() - startedAt > RESTART_DELAY.stableMs) delay = RESTART_DELAY.first;
      const restart = () => {
        timer = undefined;
        if (stopping) return;
        launch(config, o.address, o.log).then(
          (next) => {
            if (stopping) return void next.kill("SIGTERM");
            child = next;
            o.log(`internal registry: restarted on ${o.address}`);
            supervise(next, Date.now());
          },
          (err: unknown) => {
            o.log(`internal registry: restart failed: ${err instanceof Error ? err.message : String(err)}`);
            delay = Math.min(delay * 2, RESTART_DELAY.max);
            timer = setTimeout(restart, delay);
          },
        );
      };
      timer = setTimeout(restart, delay);
      delay = Math.min(delay * 2, RESTART_DELAY.max);
    });
  supervise(child, Date.now());
  return {
    get pid() {
      return child.pid!;
    },
    async stop() {
      stopping = true;
      if (timer) clearTimeout(timer);
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await exited;
    },
  };
}
