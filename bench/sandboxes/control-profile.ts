// Where the control plane's part of a REST create goes: cold creates (a shape the warm pool does
// not hold) and warm claims, interleaved, each with its database statements counted and timed
// (pg's Client.prototype.query, in this process: the server runs here) and the provider's
// `create` timed, so "control's own time" = create answered minus the provider's create.
//
//   node bench/sandboxes/control-profile.ts [runs] [--sql]     (as root; prints, writes nothing)
//
// --sql: also the statements of one cold and one warm create, in order, with their times.
import pg from "pg";
import type { LocalRuntime } from "../../packages/control/src/sandboxes/local-runtime.ts";
import { loadAvg, log, ms, requireRoot, startBenchServer, stats } from "./support.ts";

requireRoot("bench/sandboxes/control-profile");
const RUNS = Number(process.argv[2]) || 20;
const SQL = process.argv.includes("--sql");

interface Trace {
  queries: { sql: string; t0: number; ms: number }[];
  provider: number;
  marks: { name: string; t: number }[];
}
let current: Trace | undefined;
// Points a profiling build of the server marks (globalThis.__mark), if any: printed with --sql.
(globalThis as { __mark?: (name: string) => void }).__mark = (name) => void current?.marks.push({ name, t: performance.now() });
const proto: { query: (...args: unknown[]) => unknown } = pg.Client.prototype;
const query = proto.query;
proto.query = function (this: unknown, ...args: unknown[]) {
  const trace = current;
  const out = query.apply(this, args);
  if (trace && out && typeof (out as Promise<unknown>).then === "function") {
    const first = args[0];
    const sql = typeof first === "string" ? first : ((first as { text?: string })?.text ?? "?");
    const t0 = performance.now();
    const done = () => trace.queries.push({ sql: sql.replace(/\s+/g, " ").slice(0, 140), t0, ms: performance.now() - t0 });
    (out as Promise<unknown>).then(done, done);
  }
  return out;
};

const sleep = (msec: number) => new Promise((r) => setTimeout(r, msec));

async function main(): Promise<void> {
  const s = await startBenchServer({ warmPool: 1 });
  const { manager } = s.server.server.sandboxes;
  const pool = manager.pools!.default!;
  const runtime = s.server.server.sandboxes.runtime as LocalRuntime;
  const create = runtime.create.bind(runtime);
  runtime.create = async (spec) => {
    const t0 = performance.now();
    try {
      return await create(spec);
    } finally {
      if (current) current.provider += performance.now() - t0;
    }
  };
  const ids: string[] = [];
  const once = async (body: object) => {
    const trace: Trace = { queries: [], provider: 0, marks: [] };
    current = trace;
    const t0 = performance.now();
    const sb = await s.rest.ok("POST", "/sandbox", body);
    const total = performance.now() - t0;
    current = undefined;
    ids.push(sb.id);
    const execs = { first: { queries: [], provider: 0, marks: [] } as Trace, second: { queries: [], provider: 0, marks: [] } as Trace };
    current = execs.first;
    const t1 = performance.now();
    await s.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: "true" });
    const exec1 = performance.now() - t1;
    current = execs.second;
    const t2 = performance.now();
    await s.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: "true" });
    const exec2 = performance.now() - t2;
    current = undefined;
    return { total, exec1, exec2, trace, t0, execs, t1, t2 };
  };
  const poolFull = async () => {
    while (pool.stats().ready < 1) await sleep(20);
  };
  const cleanup = async () => {
    for (const id of ids.splice(0)) await s.rest.ok("DELETE", `/sandbox/${id}`);
  };
  try {
    log("warm-up: 2 cold, 2 warm");
    for (let i = 0; i < 2; i++) {
      await once({ memory: 2 });
      await poolFull();
      await once({});
    }
    await cleanup();
    const rows = { cold: [] as Awaited<ReturnType<typeof once>>[], warm: [] as Awaited<ReturnType<typeof once>>[] };
    log(`${RUNS} cold and ${RUNS} warm creates, interleaved`);
    for (let i = 0; i < RUNS; i++) {
      await poolFull(); // no refill running beside the cold create (its provider create would count)
      await sleep(300);
      rows.cold.push(await once({ memory: 2 }));
      await cleanup();
      await poolFull();
      await sleep(300); // the refill's start-up done, as a claim on an idle server finds it
      rows.warm.push(await once({}));
      await cleanup();
    }
    for (const [kind, xs] of Object.entries(rows)) {
      const st = (f: (r: (typeof xs)[number]) => number) => stats(xs.map(f));
      const line = (what: string, f: (r: (typeof xs)[number]) => number) => {
        const v = st(f);
        console.log(`${kind.padEnd(5)} ${what.padEnd(34)} p50=${ms(v.p50)} p95=${ms(v.p95)} mean=${ms(v.mean)}`);
      };
      line("create answered (ms)", (r) => r.total);
      line("provider create (ms)", (r) => r.trace.provider);
      line("control's own (ms)", (r) => r.total - r.trace.provider);
      line("statements (count)", (r) => r.trace.queries.length);
      line("statement time, summed (ms)", (r) => r.trace.queries.reduce((a, q) => a + q.ms, 0));
      line("first exec (ms)", (r) => r.exec1);
      line("second exec (ms)", (r) => r.exec2);
      line("first exec statements (count)", (r) => r.execs.first.queries.length);
      line("second exec statements (count)", (r) => r.execs.second.queries.length);
      if (SQL) {
        const r = xs[Math.floor(xs.length / 2)];
        const events = [
          ...r.trace.queries.map((q) => ({ t: q.t0, line: `${ms(q.ms).padStart(6)} ms  ${q.sql}` })),
          ...r.trace.marks.map((m) => ({ t: m.t, line: `   -- ${m.name}` })),
        ].sort((a, b) => a.t - b.t);
        for (const e of events) console.log(`   +${ms(e.t - r.t0).padStart(6)} ${e.line}`);
        console.log(`   +${ms(r.total).padStart(6)}    -- answered`);
        for (const [which, t, at] of [["first exec", r.execs.first, r.t1], ["second exec", r.execs.second, r.t2]] as const) {
          console.log(`  ${which}:`);
          const ev = [...t.queries.map((q) => ({ t: q.t0, line: `${ms(q.ms).padStart(6)} ms  ${q.sql}` })), ...t.marks.map((m) => ({ t: m.t, line: `   -- ${m.name}` }))].sort((a, b) => a.t - b.t);
          for (const e of ev) console.log(`   +${ms(e.t - at).padStart(6)} ${e.line}`);
        }
        // Mark-to-mark gaps, p50 over every run: where the time between the marks goes.
        const gaps = new Map<string, number[]>();
        for (const x of xs) {
          const ev = [{ name: "sent", t: x.t0 }, ...x.trace.marks, { name: "answered", t: x.t0 + x.total }];
          for (let i = 1; i < ev.length; i++) {
            const k = `${ev[i - 1].name} → ${ev[i].name}`;
            (gaps.get(k) ?? gaps.set(k, []).get(k)!).push(ev[i].t - ev[i - 1].t);
          }
        }
        for (const [k, v] of gaps) console.log(`   ${k.padEnd(40)} p50=${ms(stats(v).p50)} (n=${v.length})`);
      }
    }
    console.log(`load average ${loadAvg()}`);
  } finally {
    await cleanup().catch(() => undefined);
    await pool.close();
    await s.stop();
  }
}

await main();
