import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { isErrno } from "../host/files.ts";
import { sleep } from "./cgroups/types.ts";

// A lock between processes: a directory made with mkdir (atomic) holding the owner's pid. A lock
// whose owner is dead is broken, so a crashed build never blocks the next one.

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return isErrno(err, "EPERM");
  }
}

export async function acquireDirLock(dir: string, onWait?: (ownerPid: number) => void): Promise<() => Promise<void>> {
  const owner = path.join(dir, "pid");
  let reported = false;
  for (;;) {
    try {
      await mkdir(dir);
      await writeFile(owner, String(process.pid));
      return () => rm(dir, { recursive: true, force: true });
    } catch (err) {
      if (!isErrno(err, "EEXIST")) throw err;
    }
    const pid = Number((await readFile(owner, "utf8").catch(() => "")).trim());
    if (Number.isInteger(pid) && pid > 0 && !alive(pid)) {
      await rm(dir, { recursive: true, force: true });
      continue;
    }
    if (!reported && pid > 0) {
      onWait?.(pid);
      reported = true;
    }
    // No pid yet means the owner is between mkdir and writeFile; just wait.
    await sleep(200);
  }
}
