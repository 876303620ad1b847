import { readdirSync, readFileSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import * as path from "node:path";
import { errors } from "@sandbar/protocol";
import { fsCall } from "../util/fs-errors.ts";
import type { AgentContext } from "../context.ts";
import { Session, SESSION_FILE } from "./session.ts";
import type { SessionCommand } from "./session.ts";

/** How long a deleted session's processes get between SIGTERM and SIGKILL. */
const DELETE_GRACE_MS = 5000;

/** The agent's sessions, by the ids their callers chose. */
export class SessionManager {
  private readonly sessions = new Map<string, Session>();
  private readonly ctx: AgentContext;
  private counter = 0;

  constructor(ctx: AgentContext) {
    this.ctx = ctx;
    this.restore();
  }

  /**
   * Sessions an earlier agent of this sandbox left in the state dir (the sandbox's init restarted
   * it; a fresh start clears the dir): each comes back with its commands' logs and exit codes and a
   * new shell. Synchronous: it runs once, before the first session call is served.
   */
  private restore(): void {
    const root = path.join(this.ctx.stateDir, "sessions");
    let names: string[];
    try {
      names = readdirSync(root);
    } catch {
      return;
    }
    for (const name of names.filter((n) => /^\d+$/.test(n)).sort((a, b) => Number(a) - Number(b))) {
      this.counter = Math.max(this.counter, Number(name));
      const dir = path.join(root, name);
      let id: unknown;
      try {
        id = (JSON.parse(readFileSync(path.join(dir, SESSION_FILE), "utf8")) as { id?: unknown }).id;
      } catch {
        continue;
      }
      if (typeof id !== "string" || this.sessions.has(id)) continue;
      const session = new Session({ id, dir, shell: this.ctx.shell, cwd: this.ctx.workDir, env: this.ctx.env, log: this.ctx.log });
      try {
        session.restoreCommands();
      } catch (err) {
        this.ctx.log(`session ${id}: its earlier commands could not be read`, err);
      }
      this.sessions.set(id, session);
    }
  }

  async create(id: string): Promise<Session> {
    if (id.trim() === "") throw errors.invalidArgument("sessionId is required");
    if (id.length > 256) throw errors.invalidArgument("sessionId is longer than 256 characters");
    if (this.sessions.has(id)) throw errors.alreadyExists(`session already exists: ${id}`);
    // Directory names are the agent's own: session ids may hold any character.
    const dir = path.join(this.ctx.stateDir, "sessions", String(++this.counter));
    await fsCall(dir, () => mkdir(dir, { recursive: true, mode: 0o700 }));
    // Best effort: without it the session is not brought back after an agent restart.
    await writeFile(path.join(dir, SESSION_FILE), JSON.stringify({ id }), { mode: 0o600 }).catch(() => undefined);
    if (this.sessions.has(id)) throw errors.alreadyExists(`session already exists: ${id}`);
    const session = new Session({ id, dir, shell: this.ctx.shell, cwd: this.ctx.workDir, env: this.ctx.env, log: this.ctx.log });
    this.sessions.set(id, session);
    return session;
  }

  get(id: string): Session {
    const s = this.sessions.get(id);
    if (!s) throw errors.notFound(`session not found: ${id}`);
    return s;
  }

  command(sessionId: string, commandId: string): { session: Session; command: SessionCommand } {
    const session = this.get(sessionId);
    const command = session.commands.get(commandId);
    if (!command) throw errors.notFound(`command not found: ${commandId} (session ${sessionId})`);
    return { session, command };
  }

  list(): Session[] {
    return [...this.sessions.values()];
  }

  async delete(id: string, graceMs = DELETE_GRACE_MS): Promise<void> {
    const s = this.get(id);
    this.sessions.delete(id);
    await s.delete(graceMs);
  }

  /**
   * After every user process was killed: each session whose shell is gone (within `withinMs`,
   * the time its exit takes to be seen) gets a new shell, keeping its id, commands and logs.
   */
  async renewShells(withinMs = 2000): Promise<void> {
    await Promise.all(
      [...this.sessions.values()].map(async (s) => {
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([s.ended, new Promise<void>((r) => (timer = setTimeout(r, withinMs)))]);
        clearTimeout(timer);
        // Deleted meanwhile, or a shell that lived through it: left as it is.
        if (s.alive || this.sessions.get(s.id) !== s) return;
        this.sessions.set(s.id, s.renewed({ shell: this.ctx.shell, cwd: this.ctx.workDir, env: this.ctx.env, log: this.ctx.log }));
      }),
    );
  }

  /** Ends every session (agent shutdown). */
  async closeAll(graceMs: number): Promise<void> {
    const all = [...this.sessions.values()];
    this.sessions.clear();
    await Promise.all(all.map((s) => s.delete(graceMs)));
  }
}
