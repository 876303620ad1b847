/**
 * The agent's own output (its ready line, its log). Whoever reads it (the
 * runner) may go away while the agent goes on serving: a broken stdout or
 * stderr then silences that stream instead of raising an error, which would
 * be logged, which would fail again.
 */
let broken = { stdout: false, stderr: false };

for (const name of ["stdout", "stderr"] as const) {
  process[name].on("error", () => {
    broken = { ...broken, [name]: true };
  });
}

export function writeOut(text: string): void {
  if (!broken.stdout) process.stdout.write(text);
}

export function writeErr(text: string): void {
  if (!broken.stderr) process.stderr.write(text);
}

/** True for a write on a pipe or socket whose reader has gone. */
export function isBrokenPipe(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  return code === "EPIPE" || code === "ECONNRESET" || code === "ERR_STREAM_DESTROYED";
}
