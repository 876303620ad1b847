// The one poll helper for tests in every package: wait for an event by its effect, with a deadline
// that only fails a test that is really stuck (never a figure the test asserts).

/** Polls `fn` until it returns true (or fails the test after `ms`). */
export async function eventually(what: string, fn: () => boolean | Promise<boolean>, ms = 15_000): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
