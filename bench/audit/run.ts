// Audit bench: what recording adds to a state-changing call. The same method (a role's every field
// replaced, PUT /organizations/{id}/roles/{id}) through the call chain (call/chain.ts: guard,
// input checks, handler) with and without the audit recorder, on one real server's database, in
// the same run; and the whole REST call for scale.
//
//   node bench/audit/run.ts [--quick]     (writes bench/audit/RESULTS.md)
//
// --quick: 200 calls per path (to check the bench works).
import { writeFile } from "node:fs/promises";
import { create } from "@bufbuild/protobuf";
import { OrganizationRoleService, UpdateRoleRequestSchema } from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import { Permission } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";
import { AuditRecorder } from "../../packages/control/src/audit/recorder.ts";
import { Credentials } from "../../packages/control/src/auth/credentials.ts";
import { Guard } from "../../packages/control/src/auth/guard.ts";
import { contextFor, newCall } from "../../packages/control/src/call/call.ts";
import { CallChain } from "../../packages/control/src/call/chain.ts";
import { organizationRoleService } from "../../packages/control/src/services/organization-roles.ts";
import { startTestServer } from "../../packages/control/src/testing/server.ts";
import { loadAvg, log, machine, ms, Rest, stats, type Stat } from "../sandboxes/support.ts";

const QUICK = process.argv.includes("--quick");
const CALLS = QUICK ? 200 : 2000;
const ROUND = 100;
const WARMUP = 100;

const t = await startTestServer();
const rest = new Rest(t.url, t.adminKey);
const credentials = new Credentials(t.server.databaseUrl);
try {
  await credentials.start(t.server.databaseUrl);
  const [{ organization_id: org }] = (await t.server.orm.em.getConnection().execute(`select organization_id from api_key where user_id = 'sandbar-admin' limit 1`)) as [{ organization_id: string }];
  const role = (await rest.ok("POST", `/organizations/${org}/roles`, { name: "bench", description: "bench", permissions: ["read:volumes"] })).id as string;
  const body = { name: "bench", description: "bench", permissions: ["read:volumes"] };
  const input = create(UpdateRoleRequestSchema, { organizationId: org, roleId: role, ...body, permissions: [Permission.READ_VOLUMES] });

  const guard = new Guard(credentials);
  const impl = organizationRoleService(t.server.orm, credentials);
  const plain = new CallChain(guard);
  plain.mount(OrganizationRoleService, impl);
  const audited = new CallChain(guard, new AuditRecorder(t.server.orm, log));
  audited.mount(OrganizationRoleService, impl);
  const method = OrganizationRoleService.method.updateRole;
  const request = { headers: { authorization: `Bearer ${t.adminKey}`, "user-agent": "bench" }, socket: { remoteAddress: "127.0.0.1" } };
  const signal = new AbortController().signal;

  const paths: Record<string, () => Promise<unknown>> = {
    "call chain, no recorder": () => plain.unary(contextFor(newCall(request), method, signal), input),
    "call chain, recorded": () => audited.unary(contextFor(newCall(request), method, signal), input),
    "REST PUT (recorded), HTTP/1.1 keep-alive": () => rest.ok("PUT", `/organizations/${org}/roles/${role}`, body),
  };
  const figures: Record<string, number[]> = Object.fromEntries(Object.keys(paths).map((k) => [k, []]));
  for (const once of Object.values(paths)) for (let i = 0; i < WARMUP; i++) await once();
  // The paths take turns in rounds, so drifting load hits them alike.
  for (let done = 0; done < CALLS; done += ROUND) {
    for (const [name, once] of Object.entries(paths)) {
      for (let i = 0; i < ROUND; i++) {
        const t0 = performance.now();
        await once();
        figures[name]!.push(performance.now() - t0);
      }
    }
    log(`${done + ROUND}/${CALLS}`);
  }
  const s: Record<string, Stat> = Object.fromEntries(Object.entries(figures).map(([k, v]) => [k, stats(v)]));
  const base = s["call chain, no recorder"]!;
  const rec = s["call chain, recorded"]!;
  const rows = Object.entries(s).map(([k, v]) => `| ${k} | ${v.n} | ${ms(v.p50)} | ${ms(v.p99)} | ${ms(v.mean)} |`);
  const added = rec.p50 - base.p50;
  const report = `# Audit bench: what recording adds to a state-changing call

Latest run: ${new Date().toISOString()} on ${machine()};
load average at the end ${loadAvg()} (the machine is shared: other work running at the same time shows up as noise).

Command: \`node bench/audit/run.ts${QUICK ? " --quick" : ""}\`. One real control server (\`startTestServer\`, embedded
PostgreSQL). The method: \`OrganizationRoleService.UpdateRole\` (every field of a role replaced; the handler
itself writes in a transaction), called ${CALLS} times per path after ${WARMUP} warm-up calls, the paths taking
turns in rounds of ${ROUND}. "Call chain" is call/chain.ts called in process (guard with the bootstrap key,
input checks, handler), with and without the audit recorder; the REST row is the whole HTTP call for scale.

| path | calls | p50 ms | p99 ms | mean ms |
|---|---|---|---|---|
${rows.join("\n")}

Recording adds **${ms(added)} ms at p50** (${ms(rec.mean - base.mean)} ms on average): the pending row's insert,
committed before the handler runs, and the outcome's update, both committed without waiting for their WAL
flush (the handler's own durable commit flushes the WAL past the entry: see packages/control/src/audit/recorder.ts).
`;
  console.log(report);
  await writeFile(new URL("./RESULTS.md", import.meta.url), report);
} finally {
  rest.close();
  await credentials.stop();
  await t.stop();
}
