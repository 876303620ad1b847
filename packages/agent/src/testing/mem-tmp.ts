import { createClient } from "@connectrpc/connect";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { InfoService } from "@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js";
import { readFileSync } from "node:fs";
import { startAgentProcess } from "./agent-process.ts";
const a = await startAgentProcess({ command: [process.execPath, "--import=/tmp/memdbg.mjs", new URL("../../dist/agent.mjs", import.meta.url).pathname] });
const proc = createClient(ProcessService, a.transport);
const info = createClient(InfoService, a.transport);
const rss = () => { const s = readFileSync(`/proc/${a.child.pid}/status`, "utf8"); return `rss ${Math.round(Number(/VmRSS:\s+(\d+)/.exec(s)![1]) / 1024)} anon ${Math.round(Number(/RssAnon:\s+(\d+)/.exec(s)![1]) / 1024)}`; };
console.log("start", rss());
for (let i = 0; i < 1000; i++) await info.getVersion({});
console.log("after 1000 getVersion", rss());
for (let i = 0; i < 800; i++) await proc.execute({ command: "true" });
console.log("after 800 execs", rss());
for (const t of [2, 5, 10, 20]) { await new Promise((r) => setTimeout(r, t === 2 ? 2000 : (t - [2, 5, 10, 20][[2, 5, 10, 20].indexOf(t) - 1]) * 1000)); console.log(`after ${t}s idle`, rss(), a.output().split("\n").filter((l) => l.startsWith("MEM")).at(-1)); }
await a.stop();
