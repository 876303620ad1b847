// A shutdown as a list of steps, each run whatever became of the ones before it: a step that
// fails (the database went down with a Ctrl-C to the process group, say) must not keep the next
// ones (the warm pool's unmounts) from running. Failures are logged as they happen and thrown
// together at the end, so the caller's exit status says the shutdown was not clean.

export type ShutdownStep = readonly [name: string, run: () => unknown];

export async function runShutdownSteps(steps: readonly ShutdownStep[], log: (line: string) => void): Promise<void> {
  const failures: Error[] = [];
  for (const [name, run] of steps) {
    try {
      await run();
    } catch (err) {
      const error = err instanceof Error ? err : new Error(String(err));
      log(`shutdown: ${name} failed: ${error.message}`);
      failures.push(new Error(`${name}: ${error.message}`, { cause: error }));
    }
  }
  if (failures.length === 1) throw failures[0];
  if (failures.length > 1) throw new AggregateError(failures, `${failures.length} shutdown steps failed: ${failures.map((f) => f.message).join("; ")}`);
}
