import { readFile } from "node:fs/promises";
import { describe, expect, it } from "vitest";

// The README's example is the file sdk.test.ts runs: the two must not drift apart.
describe("README", () => {
  it("shows examples/quickstart.mjs as it is (without its two header comment lines)", async () => {
    const readme = await readFile(new URL("../../../README.md", import.meta.url), "utf8");
    const example = await readFile(new URL("../examples/quickstart.mjs", import.meta.url), "utf8");
    const section = readme.slice(readme.indexOf("## `@sandbar/sdk`"));
    const block = /```js\n([\s\S]*?)```/.exec(section)?.[1];
    expect(block).toBe(example.split("\n").slice(2).join("\n"));
  });
});
