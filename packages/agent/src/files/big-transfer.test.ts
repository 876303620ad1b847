import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { readFile, rm } from "node:fs/promises";
import * as path from "node:path";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { startAgentProcess } from "../testing/agent-process.ts";
import type { AgentProcess } from "../testing/agent-process.ts";

const GiB = 1024 * 1024 * 1024;
const CHUNK = 256 * 1024;

let agent: AgentProcess;
beforeAll(async () => {
  agent = await startAgentProcess();
});
afterAll(async () => {
  await agent?.stop();
});

/**
 * The agent's resident memory in MB: private (anonymous: heap, buffers) and
 * total. The rest of the total is file-backed pages of the node binary, shared
 * with every other node process (every other sandbox's agent) on the host.
 */
async function agentRss(): Promise<{ anon: number; total: number; peak: number }> {
  const status = await readFile(`/proc/${agent.child.pid}/status`, "utf8");
  const kb = (key: string) => Number(new RegExp(`${key}:\\s+(\\d+)`).exec(status)![1]);
  return { anon: kb("RssAnon") / 1024, total: kb("VmRSS") / 1024, peak: kb("VmHWM") / 1024 };
}

/** Samples the agent's memory every 50 ms until stopped; returns the highest figures seen. */
function sampleRss() {
  const max = { anon: 0, total: 0 };
  let running = true;
  const done = (async () => {
    while (running) {
      const r = await agentRss();
      max.anon = Math.max(max.anon, r.anon);
      max.total = Math.max(max.total, r.total, r.peak);
      await new Promise((res) => setTimeout(res, 50));
    }
  })();
  return async () => {
    running = false;
    await done;
    return max;
  };
}

describe("1 GiB transfers", () => {
  it("uploads and downloads 1 GiB with the agent under 100 MB resident", async () => {
    const fs = agent.client(FileService);
    const file = path.join(agent.root, "big.bin");
    // A chunk whose bytes depend on its index, so misplaced chunks change the hash.
    const base = Buffer.alloc(CHUNK);
    for (let i = 0; i < CHUNK; i++) base[i] = (i * 7) & 0xff;
    const sent = createHash("sha256");
    async function* body() {
      yield { part: { case: "header" as const, value: { path: file } } };
      for (let n = 0; n < GiB / CHUNK; n++) {
        const chunk = Buffer.from(base);
        chunk.writeUInt32BE(n, 0);
        sent.update(chunk);
        yield { part: { case: "data" as const, value: chunk } };
      }
    }
    const stopUp = sampleRss();
    const up = await fs.uploadFile(body());
    const upMem = await stopUp();
    expect(up.file?.bytes).toBe(BigInt(GiB));
    const onDisk = createHash("sha256");
    for await (const c of createReadStream(file, { highWaterMark: 1 << 20 })) onDisk.update(c as Buffer);
    const expected = sent.digest("hex");
    expect(onDisk.digest("hex")).toBe(expected);
    expect(upMem.anon).toBeLessThan(100);

    const got = createHash("sha256");
    let bytes = 0;
    const stopDown = sampleRss();
    for await (const m of fs.downloadFile({ path: file })) {
      if (m.part.case !== "data") continue;
      got.update(m.part.value);
      bytes += m.part.value.length;
    }
    const downMem = await stopDown();
    expect(bytes).toBe(GiB);
    expect(got.digest("hex")).toBe(expected);
    expect(downMem.anon).toBeLessThan(100);
    console.log(`1 GiB upload: agent peak ${upMem.anon.toFixed(0)} MB private, ${upMem.total.toFixed(0)} MB total resident; download: ${downMem.anon.toFixed(0)} MB private, ${downMem.total.toFixed(0)} MB total`);
    await rm(file);
  }, 300_000);
});
