import { readFile } from "node:fs/promises";
import { describe, expect, it } from "vitest";
import { meminfoTemplate, renderMeminfo } from "./meminfo.ts";

// The view's layout: the host's keys and line lengths whatever the figures (the file is
// rewritten in place), the limit capped at the host's memory.

describe("the /proc/meminfo view's text", () => {
  it("keeps every line's length whatever the figures, and caps the total at the host's", async () => {
    const host = await readFile("/proc/meminfo", "utf8");
    const t = meminfoTemplate(host);
    const hostTotal = t.hostTotalBytes;
    const small = renderMeminfo(t, { limitBytes: 2 ** 20, usageBytes: 0, stat: {} });
    const full = renderMeminfo(t, { limitBytes: Infinity, usageBytes: hostTotal, stat: { file: hostTotal, anon: hostTotal, active_file: hostTotal, inactive_file: hostTotal } });
    const lengths = (s: string) => s.split("\n").map((l) => l.length);
    expect(lengths(small)).toEqual(lengths(full));
    expect(Buffer.byteLength(small)).toBe(t.length);
    expect(full).toMatch(new RegExp(`^MemTotal: +${hostTotal / 1024} kB$`, "m"));
    expect(full).toMatch(/^MemFree: +0 kB$/m);
    // Every line parses as the kernel's does: "Key:", spaces, a number, " kB" where the host has it.
    const hostLines = host.trim().split("\n");
    small.trim().split("\n").forEach((line, i) => {
      expect(line).toMatch(/^\S+: +\d+( kB)?$/);
      expect(line.split(":")[0]).toBe(hostLines[i].split(":")[0]);
      expect(line.endsWith(" kB")).toBe(hostLines[i].endsWith(" kB"));
    });
  });

  it("Available adds the inactive page cache to Free; Cached is the group's file pages", () => {
    const t = meminfoTemplate("MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:    2000000 kB\nBuffers:            1000 kB\nCached:           500000 kB\nSwapTotal:       1000000 kB\nSwapFree:        1000000 kB\nHugePages_Total:       0\n");
    const text = renderMeminfo(t, { limitBytes: 2 ** 30, usageBytes: 300 * 2 ** 20, stat: { file: 100 * 2 ** 20, inactive_file: 40 * 2 ** 20 } });
    expect(text).toBe(
      "MemTotal:        1048576 kB\nMemFree:          741376 kB\nMemAvailable:     782336 kB\nBuffers:               0 kB\nCached:           102400 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\nHugePages_Total:       0\n",
    );
  });
});
