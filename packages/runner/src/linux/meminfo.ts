import type { MemoryUse } from "./cgroups/types.ts";

// A sandbox's /proc/meminfo: the host's file, key for key and line for line (procps `free` and
// `top`, psutil and libuv's os.totalmem()/os.freemem() parse it by key), with the figures of the
// sandbox group (limit, usage over both leaves, memory.stat) instead of the host's. Every line
// keeps its length whatever the figures, so the runner rewrites the file in place (one pwrite at
// offset 0, never a truncate) and a concurrent reader never sees it short.

/** Keys kept from the host: they describe the kernel (address space, page size), not memory in use. */
const HOST_KEYS = new Set(["VmallocTotal", "VmallocChunk", "Hugepagesize"]);

interface Line {
  key: string;
  /** The host's line, verbatim (HOST_KEYS), or the label ("Key:") a figure is padded after. */
  text: string;
  /** Width of the figure (right-aligned, as the kernel prints it); none: `text` is the line. */
  width?: number;
  kb: boolean;
}

export interface MeminfoTemplate {
  lines: Line[];
  hostTotalBytes: number;
  /** Length of every rendering. */
  length: number;
}

/** The layout of views of a host whose /proc/meminfo reads `host`. */
export function meminfoTemplate(host: string): MeminfoTemplate {
  const total = /^MemTotal:\s+(\d+) kB$/m.exec(host);
  if (!total) throw new Error("/proc/meminfo has no MemTotal");
  // Wide enough for any figure of a view (none exceeds the host's total), and the kernel's 8.
  const digits = Math.max(8, total[1].length);
  const lines: Line[] = [];
  for (const raw of host.split("\n")) {
    const m = /^([^:\s]+):(\s*)(\d+)( kB)?$/.exec(raw);
    if (!m) continue;
    const [, key, spaces, value, kb] = m;
    if (HOST_KEYS.has(key)) {
      lines.push({ key, text: raw, kb: kb !== undefined });
      continue;
    }
    // The kernel pads the label to 16 columns then the figure to 8; a wider figure pushes on.
    // Page counts (HugePages_*) read 0 and keep the host's width.
    const own = spaces.length + value.length;
    const width = kb === undefined ? own : Math.max(own, Math.max(1, 16 - key.length - 1) + digits);
    lines.push({ key, text: `${key}:`, width, kb: kb !== undefined });
  }
  const hostTotalBytes = Number(total[1]) * 1024;
  const template = { lines, hostTotalBytes, length: 0 };
  template.length = Buffer.byteLength(renderMeminfo(template, { limitBytes: hostTotalBytes, usageBytes: 0, stat: {} }));
  return template;
}

/** The view of a group using `use`; the limit is capped at the host's memory (none: the host's). */
export function renderMeminfo(t: MeminfoTemplate, use: MemoryUse): string {
  const figures = figuresOf(t.hostTotalBytes, use);
  let out = "";
  for (const line of t.lines) {
    if (line.width === undefined) {
      out += line.text + "\n";
      continue;
    }
    // Bytes to kB; page counts (HugePages_*) are none of a sandbox's: 0.
    const value = line.kb ? Math.floor((figures.get(line.key) ?? 0) / 1024) : 0;
    out += line.text + String(value).padStart(line.width) + (line.kb ? " kB\n" : "\n");
  }
  return out;
}

/** Figures in bytes by key; a key not here reads 0 (kernel memory, swap, hugepages: not the sandbox's). */
function figuresOf(hostTotal: number, use: MemoryUse): Map<string, number> {
  const total = Math.min(use.limitBytes, hostTotal);
  const s = (k: keyof MemoryUse["stat"]) => Math.min(use.stat[k] ?? 0, total);
  const used = Math.min(use.usageBytes, total);
  const slab = s("slab_reclaimable") + s("slab_unreclaimable");
  return new Map([
    ["MemTotal", total],
    // Free: what the group may still charge. Available adds the inactive page cache the kernel
    // reclaims first (docker stats's usage is usage minus inactive_file).
    ["MemFree", total - used],
    ["MemAvailable", Math.min(total, total - used + s("inactive_file"))],
    ["Cached", s("file")],
    ["Active", Math.min(total, s("active_anon") + s("active_file"))],
    ["Inactive", Math.min(total, s("inactive_anon") + s("inactive_file"))],
    ["Active(anon)", s("active_anon")],
    ["Inactive(anon)", s("inactive_anon")],
    ["Active(file)", s("active_file")],
    ["Inactive(file)", s("inactive_file")],
    ["Unevictable", s("unevictable")],
    ["Dirty", s("file_dirty")],
    ["Writeback", s("file_writeback")],
    ["AnonPages", s("anon")],
    ["Mapped", s("file_mapped")],
    ["Shmem", s("shmem")],
    ["KReclaimable", s("slab_reclaimable")],
    ["Slab", Math.min(total, slab)],
    ["SReclaimable", s("slab_reclaimable")],
    ["SUnreclaim", s("slab_unreclaimable")],
    ["KernelStack", s("kernel_stack")],
    ["PageTables", s("pagetables")],
    // No swap (memsw = memory on v1, swap.max 0 on v2): all a sandbox may commit is its memory.
    ["CommitLimit", total],
    ["Committed_AS", s("anon")],
    ["AnonHugePages", s("anon_thp")],
  ]);
}
