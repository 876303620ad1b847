// Child process of sdk.test.ts: uploads <MiB> MiB of fresh buffers (as a file read would give)
// to <path> in <sandbox> through the SDK, and prints its bytes, checksum and memory figures.
//   node upload-child.ts <sandboxId> <path> <MiB>      (SANDBAR_API_URL, SANDBAR_API_KEY set)
import { createHash } from "node:crypto";
import { readFile, writeFile } from "node:fs/promises";
import { Sandbar } from "../index.ts";

const [sandboxId, dest, mibArg] = process.argv.slice(2);
const MIB = 2 ** 20;
const mib = Number(mibArg);

async function vm(field: "VmRSS" | "VmHWM"): Promise<number> {
  const status = await readFile("/proc/self/status", "utf8");
  return Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(status)![1]) * 1024;
}

const sandbar = new Sandbar({ envFileDir: false });
const sandbox = sandbar.sandboxes.handleFor(sandboxId);
// Warm up the connection and the code paths, then reset the high-water mark to the RSS now.
await sandbox.fs.upload(`${dest}.warm`, Buffer.alloc(2 * MIB, 1));
await sandbox.fs.delete(`${dest}.warm`);
await writeFile("/proc/self/clear_refs", "5");
const baseRss = await vm("VmRSS");

const hash = createHash("sha256");
let quarterPeakRss = 0;
async function* source() {
  for (let i = 0; i < mib; i++) {
    if (i === mib / 4) quarterPeakRss = await vm("VmHWM");
    const chunk = Buffer.alloc(MIB, i & 0xff);
    chunk.writeUInt32BE(i, 0);
    hash.update(chunk);
    yield chunk;
  }
}
const t0 = performance.now();
const stored = await sandbox.fs.upload(dest, source());
const ms = performance.now() - t0;
const peakRss = await vm("VmHWM");
sandbar.close();
const cpu = process.cpuUsage();
process.stdout.write(JSON.stringify({ bytes: Number(stored.bytes), sha256: hash.digest("hex"), baseRss, quarterPeakRss, peakRss, ms, cpuMs: (cpu.user + cpu.system) / 1000 }));
