import { type ChildProcess, spawn } from "node:child_process";
import { EventEmitter } from "node:events";
import { fileURLToPath } from "node:url";

// Commands started by a small helper process instead of this one (spawner-process.mjs). node
// forks to spawn, and a fork copies the forking process's page tables: 7-8 ms from a control
// server of a few hundred MB, 1.5-2 ms from a bare node (bench/runner/spawn-cost.ts). A cold
// start spawns twice (the root's mounts, the launcher), a destroy twice (umounts).
// One helper per runner process, started at the provider's open; until it says it is ready (and
// whenever it is gone) callers spawn for themselves, so nothing waits for it. It exits when this
// process does (its IPC channel closes), not on the signals of its process group (a Ctrl-C
// reaches it with this process, whose shutdown still needs it); what it launched is detached and
// stays. What it starts does not inherit the channel (node opens it close-on-exec; spawner.test.ts checks).

const HELPER = fileURLToPath(new URL("./spawner-process.mjs", import.meta.url));

interface RunRequest {
  cmd: string;
  args: readonly string[];
  cwd?: string;
  env: NodeJS.ProcessEnv;
  input?: string;
}
type RunAnswer = { code: number | null; signal: string | null; stdout: string; stderr: string };

interface LaunchRequest {
  cmd: string;
  args: string[];
  logFile: string;
  seccompFile?: string;
  /** Written to the child's fd 3 (a pipe), then closed. */
  pipe3: Buffer;
  oomScoreAdj?: number;
}

/** A process the helper launched: the parts of a ChildProcess the provider uses ("exit" events). */
class RemoteChild extends EventEmitter {
  readonly pid: number | undefined;
  readonly oomScoreDenied: boolean;
  exitCode: number | null = null;
  signalCode: NodeJS.Signals | null = null;
  constructor(pid: number | undefined, oomScoreDenied: boolean) {
    super();
    this.pid = pid;
    this.oomScoreDenied = oomScoreDenied;
  }
}

type Message = { id: number; error?: string; exit?: boolean; pid?: number; oomScoreDenied?: boolean } & Partial<RunAnswer>;
type Pending = { resolve: (m: Message) => void; reject: (e: Error) => void };

class Spawner {
  readonly #child: ChildProcess;
  #ready = false;
  /** Resolves true once the helper answers, false if it is gone first. */
  readonly started: Promise<boolean>;
  #started: (ok: boolean) => void = () => undefined;
  #gone = false;
  #next = 1;
  readonly #pending = new Map<number, Pending>();
  /** Launched processes whose exit is still to be told. */
  readonly #launched = new Map<number, RemoteChild>();

  constructor() {
    this.started = new Promise((resolve) => (this.#started = resolve));
    // A small heap keeps the helper's own forks cheap.
    this.#child = spawn(process.execPath, ["--max-semi-space-size=1", HELPER], { stdio: ["ignore", "ignore", "inherit", "ipc"], env: process.env });
    this.#child.unref(); // the channel stays referenced until it is ready: one waiting for it waits
    this.#child.on("message", (m: Message & { ready?: boolean }) => {
      if (m.ready) {
        this.#ready = true;
        this.#unrefIfIdle();
        return this.#started(true);
      }
      if (m.exit) {
        const c = this.#launched.get(m.id);
        this.#launched.delete(m.id);
        if (!c) return;
        c.exitCode = m.code ?? null;
        c.signalCode = (m.signal as NodeJS.Signals | null) ?? null;
        c.emit("exit", c.exitCode, c.signalCode);
        return;
      }
      const p = this.#pending.get(m.id);
      this.#pending.delete(m.id);
      this.#unrefIfIdle();
      if (m.error !== undefined) p?.reject(new Error(m.error));
      else p?.resolve(m);
    });
    const gone = () => {
      if (this.#gone) return;
      this.#gone = true;
      this.#started(false);
      if (shared === this) shared = undefined;
      for (const p of this.#pending.values()) p.reject(new Error("the runner's spawner process exited"));
      this.#pending.clear();
      // Their exits cannot be told any more; the provider still sees them through the cgroup.
      this.#launched.clear();
    };
    this.#child.on("exit", gone);
    this.#child.on("error", gone);
    this.#child.on("disconnect", gone);
  }

  get pid(): number | undefined {
    return this.#child.pid;
  }

  /** Ends the helper (tests: what happens when it dies). */
  kill(): void {
    this.#child.kill("SIGKILL");
  }

  get usable(): boolean {
    return this.#ready && !this.#gone;
  }

  run(r: RunRequest): Promise<RunAnswer> {
    return this.#ask({ op: "run", ...r }) as Promise<RunAnswer>;
  }

  async launch(r: LaunchRequest): Promise<RemoteChild> {
    const id = this.#next;
    // Registered before the request: the exit may follow the answer at once.
    const child = new RemoteChild(undefined, false);
    let m: Message;
    try {
      m = await this.#ask({ op: "launch", ...r, pipe3: r.pipe3.toString("base64") }, () => this.#launched.set(id, child));
    } catch (err) {
      this.#launched.delete(id);
      throw err;
    }
    const launched = new RemoteChild(m.pid, m.oomScoreDenied === true);
    if (this.#launched.get(id) === child) this.#launched.set(id, launched);
    else {
      // Exited between the answer and now: already told to the placeholder.
      launched.exitCode = child.exitCode;
      launched.signalCode = child.signalCode;
      queueMicrotask(() => launched.emit("exit", launched.exitCode, launched.signalCode));
    }
    return launched; // unlike an awaited answer, a running sandbox does not keep this process running
  }

  #ask(message: Record<string, unknown>, before?: () => void): Promise<Message> {
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      if (this.#gone) return reject(new Error("the runner's spawner process exited"));
      before?.();
      this.#pending.set(id, { resolve, reject });
      this.#child.channel?.ref(); // an answer awaited keeps this process running
      this.#child.send({ id, ...message }, (err) => {
        if (!err) return;
        this.#pending.delete(id);
        this.#unrefIfIdle();
        reject(err);
      });
    });
  }

  #unrefIfIdle(): void {
    if (this.#pending.size === 0) this.#unrefChannel();
  }

  #unrefChannel(): void {
    this.#child.channel?.unref();
  }
}

let shared: Spawner | undefined;

/** Starts the helper if it is not running (provider open: it is ready long before a first start). */
export function startSpawner(): void {
  if (process.env.SANDBAR_NO_SPAWNER === "1") return;
  shared ??= new Spawner();
}

/** The helper when it is ready; undefined: spawn here (it is being started, or was turned off). */
export function spawner(): Spawner | undefined {
  if (shared === undefined) startSpawner();
  return shared?.usable ? shared : undefined;
}

/** The helper once it is ready (tests); undefined when it is turned off or died starting. */
export async function readySpawner(): Promise<Spawner | undefined> {
  startSpawner();
  const s = shared;
  return s && (await s.started) ? s : undefined;
}
