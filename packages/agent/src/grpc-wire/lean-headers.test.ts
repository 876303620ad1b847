import { describe, expect, it } from "vitest";
import { LeanHeaders } from "./lean-headers.ts";

// The bundle swaps the global Headers for LeanHeaders (build.ts): each case runs the same
// operations on both and expects the same observable result.
type Op = (h: Headers | LeanHeaders) => unknown;
// The init shapes both constructors take (Headers also takes arrays of values per name, LeanHeaders not).
type Init = [string, string][] | Record<string, string> | Headers;

const observe = (h: Headers | LeanHeaders) => ({
  entries: [...h.entries()],
  keys: [...h.keys()],
  values: [...h.values()],
  spread: [...h],
  setCookie: h.getSetCookie(),
  forEach: (() => {
    const seen: [string, string][] = [];
    h.forEach((v, k) => seen.push([k, v]));
    return seen;
  })(),
});

function both(init: Init | undefined, ops: Op[]) {
  const run = (make: () => Headers | LeanHeaders) => {
    const h = make();
    const results = ops.map((op) => {
      try {
        return { ok: op(h) ?? null };
      } catch (err) {
        return { threw: (err as Error).constructor.name };
      }
    });
    return { results, state: observe(h) };
  };
  return { lean: run(() => new LeanHeaders(init)), web: run(() => new Headers(init)) };
}

describe("LeanHeaders behaves as the WHATWG Headers", () => {
  const cases: [string, Init | undefined, Op[]][] = [
    ["empty", undefined, [(h) => h.get("x"), (h) => h.has("x")]],
    ["record init, case-insensitive names", { "Content-Type": "application/grpc", "X-A": "1" }, [(h) => h.get("content-type"), (h) => h.get("CONTENT-TYPE"), (h) => h.has("x-a")]],
    ["pairs init, repeated names joined", [["a", "1"], ["A", "2"], ["b", "3"]], [(h) => h.get("a")]],
    ["headers init copies", new Headers([["grpc-status", "0"], ["grpc-message", "ok"]]), [(h) => h.get("grpc-status")]],
    ["append, set replaces, delete", undefined, [(h) => h.append("x", "1"), (h) => h.append("X", "2"), (h) => h.get("x"), (h) => h.set("x", "3"), (h) => h.get("x"), (h) => h.delete("X"), (h) => h.has("x")]],
    ["values trimmed of HTTP whitespace", undefined, [(h) => h.set("x", " \t v a l \n"), (h) => h.get("x")]],
    ["sorted iteration, set-cookie kept apart", undefined, [(h) => h.append("zeta", "z"), (h) => h.append("set-cookie", "a=1"), (h) => h.append("Set-Cookie", "b=2"), (h) => h.append("alpha", "a"), (h) => h.get("set-cookie")]],
    ["empty value", undefined, [(h) => h.set("x", ""), (h) => h.get("x"), (h) => h.has("x")]],
    ["invalid name throws", undefined, [(h) => h.set("bad name", "v"), (h) => h.append("", "v"), (h) => h.get("a:b")]],
    ["invalid value throws", undefined, [(h) => h.set("x", "a\nb"), (h) => h.append("x", "a\0b"), (h) => h.set("y", "a\rb")]],
    // Reflect.apply passes the number the types refuse, as untyped callers may.
    ["non-string values coerced", undefined, [(h) => Reflect.apply(h.set, h, ["n", 42]), (h) => h.get("n")]],
  ];
  for (const [name, init, ops] of cases) {
    it(name, () => {
      const { lean, web } = both(init, ops);
      expect(lean).toEqual(web);
    });
  }

  it("rejects init pairs that are not pairs, as Headers does", () => {
    // Reflect.construct passes the one-element pair the types refuse.
    expect(() => Reflect.construct(Headers, [[["a"]]])).toThrow(TypeError);
    expect(() => Reflect.construct(LeanHeaders, [[["a"]]])).toThrow(TypeError);
  });

  it("copies from itself and from Node's Headers alike", () => {
    const lean = new LeanHeaders({ a: "1", "set-cookie": "c=1" });
    lean.append("set-cookie", "d=2");
    expect([...new LeanHeaders(lean)]).toEqual([...new Headers([...lean])]);
    expect(Object.prototype.toString.call(lean)).toBe("[object Headers]");
  });
});
