// The client of `cpu.ts --upload` in a process of its own, so that the control process's CPU
// figures are control's alone: one multipart bulk-upload, then its own CPU time as JSON.
//
//   node bench/toolbox/upload-client.ts <url> <key> <sandboxId> <dest> <MiB>
import { randomBytes } from "node:crypto";
import { bulkUpload } from "../../packages/control/src/testing/bulk-upload.ts";

const [url, key, sandboxId, dest, mib] = process.argv.slice(2);
const chunk = randomBytes(2 ** 20);
const c0 = process.cpuUsage();
await bulkUpload({ url, key, sandboxId, dest, mib: Number(mib), chunk: () => chunk });
console.log(JSON.stringify(process.cpuUsage(c0)));
