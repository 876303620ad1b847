import { errors } from "@sandbar/protocol";

// Host uids for sandboxes: one per sandbox from a dedicated range, so no two sandboxes (and no
// host user) share file ownership or signal rights, except a lineage: forks and sandboxes made
// from a captured layer run as its author's uid (they own its files), counted per holder. Runners sharing a host need disjoint ranges.

const DEFAULT_UID_BASE = 1_500_000_000;
const DEFAULT_UID_COUNT = 65_536;

export class UidAllocator {
  readonly base: number;
  readonly count: number;
  /** Holders per uid: a sandbox, and the sandboxes and captured layers of its lineage sharing it. */
  readonly #used = new Map<number, number>();

  constructor(base = DEFAULT_UID_BASE, count = DEFAULT_UID_COUNT) {
    if (!Number.isInteger(base) || !Number.isInteger(count) || base < 1000 || count < 1 || base + count > 2 ** 31 - 2) {
      throw new Error(`invalid sandbox uid range ${base}+${count}`);
    }
    this.base = base;
    this.count = count;
  }

  /** One more holder of `uid` (a sandbox or layer found on disk, a sandbox made on a layer). */
  markUsed(uid: number): void {
    this.#used.set(uid, (this.#used.get(uid) ?? 0) + 1);
  }

  /** The lowest free uid of the range. */
  allocate(): number {
    for (let uid = this.base; uid < this.base + this.count; uid++) {
      if (!this.#used.has(uid)) {
        this.#used.set(uid, 1);
        return uid;
      }
    }
    throw errors.resourceExhausted(`all ${this.count} sandbox uids of this runner are in use`);
  }

  /** One holder fewer; the uid is free again when none is left. */
  release(uid: number): void {
    const n = (this.#used.get(uid) ?? 0) - 1;
    if (n > 0) this.#used.set(uid, n);
    else this.#used.delete(uid);
  }
}
