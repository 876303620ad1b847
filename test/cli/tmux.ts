import { execFileSync } from "node:child_process";

/**
 * A real terminal for the CLI: a detached tmux session on a private server socket. Keys go in
 * with send-keys; the screen comes back with capture-pane (wrapped lines joined).
 */
export class Tmux {
  readonly socket = `sandbar-cli-test-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
  readonly session = "cli";

  private tmux(...args: string[]): string {
    return execFileSync("tmux", ["-L", this.socket, ...args], { encoding: "utf8" });
  }

  /** A bash with no rc files, `host$ ` as its prompt, the given environment, in a cols x rows window. */
  start(opts: { cols: number; rows: number; env: Record<string, string> }): void {
    this.tmux("-f", "/dev/null", "new-session", "-d", "-s", this.session, "-x", String(opts.cols), "-y", String(opts.rows), ...Object.entries(opts.env).flatMap(([k, v]) => ["-e", `${k}=${v}`]), "bash --norc --noprofile");
    // The window keeps the size we give it, attached client or not.
    this.tmux("set-option", "-g", "window-size", "manual");
    this.tmux("set-option", "-g", "history-limit", "5000");
    this.line("PS1='host$ '");
  }

  /** Types a line and presses Enter. */
  line(text: string): void {
    this.tmux("send-keys", "-t", this.session, "-l", text);
    this.tmux("send-keys", "-t", this.session, "Enter");
  }

  keys(...keys: string[]): void {
    this.tmux("send-keys", "-t", this.session, ...keys);
  }

  resize(cols: number, rows: number): void {
    this.tmux("resize-window", "-t", this.session, "-x", String(cols), "-y", String(rows));
  }

  /** The screen and its scrollback, wrapped lines joined. */
  screen(): string {
    return this.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", this.session);
  }

  /** Resolves with the screen once `pattern` shows on it. */
  async waitFor(pattern: RegExp, timeoutMs = 30_000): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const text = this.screen();
      if (pattern.test(text)) return text;
      if (Date.now() > deadline) throw new Error(`terminal never showed ${pattern}; screen:\n${text}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** Clears the screen and scrollback, so the next waitFor sees only new output. */
  clear(): void {
    this.tmux("send-keys", "-t", this.session, "-R");
    this.tmux("clear-history", "-t", this.session);
  }

  kill(): void {
    try {
      this.tmux("kill-server");
    } catch {
      // already gone
    }
  }
}
