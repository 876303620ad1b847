import { errors } from "@sandbar/protocol";

// Host uids for sandboxes: one per sandbox from a dedicated range, so no two sandboxes (and no
// host user) share file ownership or signal rights. Runners sharing a host need disjoint ranges.

const DEFAULT_UID_BASE = 1_500_000_000;
const DEFAULT_UID_COUNT = 65_536;

export class UidAllocator {
  readonly base: number;
  readonly count: number;
  readonly #used = new Set<number>();

  constructor(base = DEFAULT_UID_BASE, count = DEFAULT_UID_COUNT) {
    if (!Number.isInteger(base) || !Number.isInteger(count) || base < 1000 || count < 1 || base + count > 2 ** 31 - 2) {
      throw new Error(`invalid sandbox uid range ${base}+${count}`);
    }
    this.base = base;
    this.count = count;
  }

  markUsed(uid: number): void {
    this.#used.add(uid);
  }

  /** The lowest free uid of the range. */
  allocate(): number {
    for (let uid = this.base; uid < this.base + this.count; uid++) {
      if (!this.#used.has(uid)) {
        this.#used.add(uid);
        return uid;
      }
    }
    throw errors.resourceExhausted(`all ${this.count} sandbox uids of this runner are in use`);
  }

  release(uid: number): void {
    this.#used.delete(uid);
  }
}
