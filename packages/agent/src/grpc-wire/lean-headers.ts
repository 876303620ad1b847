/**
 * A WHATWG `Headers` for the bundled agent (build.ts injects it for every
 * reference to the global in the bundle, Connect's included). Node's own
 * global loads undici (fetch, web streams, zlib) on first touch: 15-30 ms of
 * every agent's first call, for a class Connect only uses as a header map.
 * Same observable behaviour for what the agent does with it: names are
 * case-insensitive, values trimmed, repeated values joined with ", ",
 * iteration sorted by name with set-cookie kept apart; invalid names and
 * values throw a TypeError as the standard's do.
 */

type HeadersInit = Iterable<readonly [string, string]> | Record<string, string> | LeanHeaders;

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// Leading and trailing HTTP whitespace (tab, LF, CR, space) is removed; NUL, LF and CR inside are invalid.
const EDGE_WHITESPACE = /^[\t\n\r ]+|[\t\n\r ]+$/g;
const INVALID_VALUE = /[\0\n\r]/;

function headerName(name: string): string {
  const n = String(name);
  if (!TOKEN.test(n)) throw new TypeError(`Headers: invalid header name "${n}"`);
  return n.toLowerCase();
}

function headerValue(value: string): string {
  const v = String(value).replace(EDGE_WHITESPACE, "");
  if (INVALID_VALUE.test(v)) throw new TypeError(`Headers: invalid header value "${v}"`);
  return v;
}

export class LeanHeaders {
  readonly #values = new Map<string, string[]>();

  constructor(init?: HeadersInit) {
    if (init === undefined || init === null) return;
    if (typeof init !== "object") throw new TypeError("Headers: init must be an object or a sequence of pairs");
    if (Symbol.iterator in init) {
      for (const pair of init as Iterable<readonly [string, string]>) {
        if (pair.length !== 2) throw new TypeError("Headers: each pair of the init sequence needs a name and a value");
        this.append(pair[0], pair[1]);
      }
    } else {
      for (const [name, value] of Object.entries(init)) this.append(name, value);
    }
  }

  append(name: string, value: string): void {
    const n = headerName(name);
    const v = headerValue(value);
    const list = this.#values.get(n);
    if (list) list.push(v);
    else this.#values.set(n, [v]);
  }

  set(name: string, value: string): void {
    this.#values.set(headerName(name), [headerValue(value)]);
  }

  get(name: string): string | null {
    return this.#values.get(headerName(name))?.join(", ") ?? null;
  }

  getSetCookie(): string[] {
    return [...(this.#values.get("set-cookie") ?? [])];
  }

  has(name: string): boolean {
    return this.#values.has(headerName(name));
  }

  delete(name: string): void {
    this.#values.delete(headerName(name));
  }

  forEach(callback: (value: string, name: string, headers: LeanHeaders) => void, thisArg?: unknown): void {
    for (const [name, value] of this) callback.call(thisArg, value, name, this);
  }

  *entries(): IterableIterator<[string, string]> {
    for (const name of [...this.#values.keys()].sort()) {
      const list = this.#values.get(name);
      if (!list) continue;
      if (name === "set-cookie") for (const v of list) yield [name, v];
      else yield [name, list.join(", ")];
    }
  }

  *keys(): IterableIterator<string> {
    for (const [name] of this.entries()) yield name;
  }

  *values(): IterableIterator<string> {
    for (const [, value] of this.entries()) yield value;
  }

  [Symbol.iterator](): IterableIterator<[string, string]> {
    return this.entries();
  }

  get [Symbol.toStringTag](): string {
    return "Headers";
  }
}

export { LeanHeaders as Headers };
