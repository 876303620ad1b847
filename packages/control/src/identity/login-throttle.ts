/**
 * Slows password guessing: after MAX_FAILURES wrong passwords for one login (or from one
 * address) within WINDOW_MS, further attempts are refused until the window passes. Per
 * process, in memory: a bound on guesses, not an audit trail.
 */
const MAX_FAILURES = 10;
const WINDOW_MS = 15 * 60_000;
const MAX_ENTRIES = 50_000;

export class LoginThrottle {
  private readonly failures = new Map<string, { count: number; since: number }>();

  /** True when this login or address has failed too often lately. */
  blocked(login: string, address: string): boolean {
    return [`l:${login.toLowerCase()}`, `a:${address}`].some((k) => {
      const f = this.failures.get(k);
      return !!f && Date.now() - f.since < WINDOW_MS && f.count >= MAX_FAILURES;
    });
  }

  failed(login: string, address: string): void {
    if (this.failures.size > MAX_ENTRIES) this.failures.clear();
    for (const k of [`l:${login.toLowerCase()}`, `a:${address}`]) {
      const f = this.failures.get(k);
      if (!f || Date.now() - f.since >= WINDOW_MS) this.failures.set(k, { count: 1, since: Date.now() });
      else f.count++;
    }
  }

  succeeded(login: string): void {
    this.failures.delete(`l:${login.toLowerCase()}`);
  }
}
