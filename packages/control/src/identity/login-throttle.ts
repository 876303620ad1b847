import { createHash } from "node:crypto";
import { isIP } from "node:net";
import type pg from "pg";
import { RateLimiterMemory, RateLimiterPostgres, RateLimiterRes, type RateLimiterAbstract } from "rate-limiter-flexible";

/**
 * Bounds password guessing at the built-in issuer's login page without letting a stranger lock
 * anyone out:
 *
 * - refused (429) for the rest of the window: an address after `addressLimit` failed sign-ins (any
 *   logins), and one login from one address after `pairLimit`. Nothing else is ever refused: an
 *   address that is not itself throttled always has its password checked, so wrong passwords from
 *   elsewhere never block the right one.
 * - slowed: each login's sign-ins wait a delay that grows with its failures from every address
 *   (none for the first `freeFailures`, then `baseDelayMs` doubling up to `maxDelayMs`), except the
 *   right password from an address that has signed in to that account before (a known-good
 *   address, kept by the issuer in table sign_in_address), which passes at once.
 *
 * An attempt counts when it starts and is taken back when it succeeds, so concurrent guesses
 * cannot overshoot a limit. Addresses are IPv4 addresses or IPv6 /64 prefixes (one host's or
 * site's usual allocation). Counters live where the rate limits' do (SANDBAR_RATE_LIMIT_STORE):
 * in memory for one control process, in PostgreSQL (table rate_limit) when several share the
 * database, so the limits hold across processes. Keys are SHA-256 digests: the table holds no
 * login or address in clear.
 */
export interface LoginThrottleOptions {
  /** The fixed window failures are counted in, in seconds. */
  windowSeconds: number;
  /** Failures of one login from one address before that pair is refused. */
  pairLimit: number;
  /** Failures from one address, any logins, before the address is refused. */
  addressLimit: number;
  /** Failures of a login, from anywhere, before its sign-ins are slowed. */
  freeFailures: number;
  baseDelayMs: number;
  maxDelayMs: number;
}

export const DEFAULT_LOGIN_THROTTLE: LoginThrottleOptions = {
  windowSeconds: 15 * 60,
  pairLimit: 10,
  addressLimit: 30,
  freeFailures: 5,
  baseDelayMs: 250,
  maxDelayMs: 4000,
};

/** Where the counters live: this process's memory, or the shared database's rate_limit table. */
export type ThrottleStore = { kind: "memory" } | { kind: "postgres"; pool: pg.Pool };

/** What an attempt may do: refused for `retryAfterMs`, or go on after `delayMs` (unless it proves itself from a known-good address). */
export type Admission = { refused: true; retryAfterMs: number } | { refused: false; delayMs: number };

export class LoginThrottle {
  readonly options: LoginThrottleOptions;
  private readonly pair: RateLimiterAbstract;
  private readonly address: RateLimiterAbstract;
  private readonly account: RateLimiterAbstract;

  constructor(store: ThrottleStore = { kind: "memory" }, options: Partial<LoginThrottleOptions> = {}) {
    this.options = { ...DEFAULT_LOGIN_THROTTLE, ...options };
    const { windowSeconds: duration, pairLimit, addressLimit } = this.options;
    const make = (keyPrefix: string, points: number): RateLimiterAbstract =>
      store.kind === "memory"
        ? new RateLimiterMemory({ keyPrefix, points, duration })
        : new RateLimiterPostgres({ storeClient: store.pool, storeType: "pool", tableName: "rate_limit", tableCreated: true, clearExpiredByTimeout: false, keyPrefix, points, duration });
    this.pair = make("login-pair", pairLimit);
    this.address = make("login-address", addressLimit);
    this.account = make("login-account", Number.MAX_SAFE_INTEGER);
  }

  /** Before anything is looked up: how long this address is still refused (0: it is not). */
  async addressRefusedFor(address: string): Promise<number> {
    const res = await this.address.get(digest(addressKey(address)));
    return res && res.consumedPoints >= this.options.addressLimit ? Math.max(1, res.msBeforeNext) : 0;
  }

  /**
   * Counts an attempt on `account` (a user id, or the login as typed when it names no one) from
   * `address`: refused when the pair or the address is at its limit, else the delay to apply.
   */
  async begin(account: string, address: string): Promise<Admission> {
    const keys = this.keys(account, address);
    const refused = await consumeOrRefuse(this.pair, keys.pair);
    if (refused !== undefined) return { refused: true, retryAfterMs: refused };
    const addressRefused = await consumeOrRefuse(this.address, keys.address);
    if (addressRefused !== undefined) {
      await this.pair.reward(keys.pair, 1);
      return { refused: true, retryAfterMs: addressRefused };
    }
    const failures = (await this.account.penalty(keys.account, 1)).consumedPoints - 1;
    return { refused: false, delayMs: this.delayAfter(failures) };
  }

  /**
   * The attempt begun for this account and address succeeded: it is taken back, and the pair's
   * failures are forgotten (the address knows the password). The address's and the account's
   * other failures stay: a success proves nothing about the other attempts.
   */
  async succeeded(account: string, address: string): Promise<void> {
    const keys = this.keys(account, address);
    await Promise.all([this.pair.delete(keys.pair), this.address.reward(keys.address, 1), this.account.reward(keys.account, 1)]);
  }

  /** The slowdown after `failures` failures of a login: none, then doubling, bounded. */
  delayAfter(failures: number): number {
    const { freeFailures, baseDelayMs, maxDelayMs } = this.options;
    if (failures < freeFailures) return 0;
    return Math.min(maxDelayMs, baseDelayMs * 2 ** Math.min(failures - freeFailures, 30));
  }

  private keys(account: string, address: string) {
    const a = addressKey(address);
    return { pair: digest(`${account}\n${a}`), address: digest(a), account: digest(account) };
  }
}

/** Consumes one point; answers how long the key stays refused when it is past its limit. */
async function consumeOrRefuse(limiter: RateLimiterAbstract, key: string): Promise<number | undefined> {
  try {
    await limiter.consume(key, 1);
    return undefined;
  } catch (err) {
    if (err instanceof RateLimiterRes) return Math.max(1, err.msBeforeNext);
    throw err;
  }
}

const digest = (s: string) => createHash("sha256").update(s).digest("base64url");

/**
 * The unit an address is counted and remembered by: an IPv4 address as is, an IPv6 address by
 * its /64 (a host is usually given a whole /64, and could otherwise take a fresh address for
 * every guess).
 */
export function addressKey(address: string): string {
  const plain = address.split("%")[0]!;
  if (isIP(plain) !== 6) return address;
  const groups = ipv6Groups(plain);
  return groups ? `${groups.slice(0, 4).map((g) => g.toString(16)).join(":")}::/64` : address;
}

/** The eight 16-bit groups of an IPv6 address (`::` expanded, a trailing dotted IPv4 part converted). */
function ipv6Groups(address: string): number[] | undefined {
  let text = address;
  const v4 = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (v4) {
    const [a, b, c, d] = v4.slice(1).map(Number) as [number, number, number, number];
    text = text.slice(0, v4.index) + `${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, tail] = text.split("::");
  const part = (s: string | undefined) => (s ? s.split(":").map((h) => parseInt(h, 16)) : []);
  const left = part(head);
  const right = tail === undefined ? [] : part(tail);
  const zeros = tail === undefined ? 0 : 8 - left.length - right.length;
  const groups = [...left, ...Array<number>(Math.max(0, zeros)).fill(0), ...right];
  return groups.length === 8 && groups.every((g) => Number.isInteger(g) && g >= 0 && g <= 0xffff) ? groups : undefined;
}
