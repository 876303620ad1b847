import type { Command } from "commander";
import { SandboxService, SandboxSchema, SandboxState, type Sandbox } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { openContext, type Context } from "../context.ts";
import type { GlobalOptions } from "../global-options.ts";
import { CliError } from "../failure.ts";
import { run } from "../run.ts";
import { collect, keyValue, nonNegativeInt, positiveInt } from "./parse.ts";
import { asJson, enumLabel, sleep, when } from "./shared.ts";

const stateLabel = (s: SandboxState) => enumLabel(SandboxState, s, "SANDBOX_STATE_");
const FAILED = new Set([SandboxState.ERROR, SandboxState.BUILD_FAILED]);

function row(s: Sandbox) {
  return { id: s.id, name: s.name, state: stateLabel(s.state), snapshot: s.snapshot ?? "", cpu: s.cpu, memory: `${s.memory}G`, disk: `${s.disk}G`, created: when(s.createdAt) };
}
const COLUMNS = ["id", "name", "state", "snapshot", "cpu", "memory", "disk", "created"];

function show(ctx: Context, s: Sandbox): void {
  ctx.out.result(asJson(SandboxSchema, s), () => {
    const labels = Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(", ");
    const lines: Array<[string, string]> = [
      ["id", s.id], ["name", s.name], ["state", stateLabel(s.state) + (s.errorReason ? ` (${s.errorReason})` : "")], ["snapshot", s.snapshot ?? ""],
      ["resources", `${s.cpu} cpu, ${s.memory} GiB memory, ${s.disk} GiB disk`], ["user", s.user], ["labels", labels], ["created", when(s.createdAt)],
    ];
    for (const [k, v] of lines) console.log(`${ctx.out.paint("dim", k.padEnd(10))} ${v}`);
  });
}

/** Polls until the sandbox reaches `target` (or fails, or the time is up). */
async function waitFor(ctx: Context, id: string, target: SandboxState, timeoutSec: number): Promise<Sandbox> {
  const deadline = Date.now() + timeoutSec * 1000;
  const sandboxes = ctx.client(SandboxService);
  for (;;) {
    const s = await sandboxes.getSandbox({ sandboxId: id });
    if (s.state === target) return s;
    if (FAILED.has(s.state)) throw new CliError(`Sandbox ${s.id} is in state ${stateLabel(s.state)}${s.errorReason ? `: ${s.errorReason}` : ""}; \`sandbar sandbox delete ${s.id}\` removes it.`);
    if (Date.now() > deadline) throw new CliError(`Sandbox ${s.id} is still ${stateLabel(s.state)} after ${timeoutSec} s: check later with \`sandbar sandbox get ${s.id}\`.`);
    await sleep(300);
  }
}

export function sandboxCommands(program: Command): void {
  const sandbox = program.command("sandbox").alias("sandboxes").description("create, list and manage sandboxes");
  const timeout = ["--timeout <seconds>", "how long to wait for the state change", positiveInt("--timeout"), 300] as const;

  sandbox
    .command("create")
    .description("create a sandbox and wait until it has started")
    .option("--name <name>", "a name (unique in the organization); default: its id")
    .option("--snapshot <snapshot>", "the snapshot to boot from; default: the server's default snapshot")
    .option("--cpu <n>", "cores", positiveInt("--cpu"))
    .option("--memory <gib>", "memory in GiB", positiveInt("--memory"))
    .option("--disk <gib>", "disk in GiB", positiveInt("--disk"))
    .option("--user <user>", "the user commands run as")
    .option("-e, --env <KEY=VALUE>", "an environment variable (repeatable)", keyValue("--env"))
    .option("-l, --label <KEY=VALUE>", "a label (repeatable)", keyValue("--label"))
    .option("--target <region>", "region")
    .option("--auto-stop <minutes>", "stop after this many idle minutes (0: never)", nonNegativeInt("--auto-stop"))
    .option("--volume <VOLUME:/mount/path>", "mount a volume (repeatable)", collect)
    .option("--no-wait", "return at once, without waiting for the start")
    .option(...timeout)
    .action(
      run(async (o: { name?: string; snapshot?: string; cpu?: number; memory?: number; disk?: number; user?: string; env?: Record<string, string>; label?: Record<string, string>; target?: string; autoStop?: number; volume?: string[]; wait: boolean; timeout: number }, globals: GlobalOptions) => {
        const volumes = (o.volume ?? []).map((v) => {
          const i = v.indexOf(":");
          if (i <= 0 || !v.slice(i + 1).startsWith("/")) throw new CliError(`--volume takes VOLUME:/mount/path, got "${v}".`, 2);
          return { volumeId: v.slice(0, i), mountPath: v.slice(i + 1) };
        });
        const ctx = await openContext(globals);
        let s = await ctx.client(SandboxService).createSandbox({
          name: o.name, snapshot: o.snapshot, cpu: o.cpu, memory: o.memory, disk: o.disk, user: o.user, env: o.env ?? {}, labels: o.label ?? {}, target: o.target, autoStopInterval: o.autoStop, volumes,
        });
        if (o.wait && s.state !== SandboxState.STARTED) {
          ctx.out.note(`Created ${s.id}; waiting for it to start...`);
          s = await waitFor(ctx, s.id, SandboxState.STARTED, o.timeout);
        }
        show(ctx, s);
      }),
    );

  sandbox
    .command("list")
    .alias("ls")
    .description("list the organization's sandboxes")
    .option("-l, --label <KEY=VALUE>", "only sandboxes with this label (repeatable)", keyValue("--label"))
    .action(
      run(async (o: { label?: Record<string, string> }, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        const { items } = await ctx.client(SandboxService).listSandboxes({ labels: o.label ? JSON.stringify(o.label) : undefined });
        ctx.out.result(items.map((s) => asJson(SandboxSchema, s)), () => (items.length ? ctx.out.table(items.map(row), COLUMNS) : ctx.out.note("No sandboxes.")));
      }),
    );

  sandbox
    .command("get")
    .description("show one sandbox")
    .argument("<sandbox>", "sandbox id or name")
    .action(
      run(async (id: string, _o: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        show(ctx, await ctx.client(SandboxService).getSandbox({ sandboxId: id }));
      }),
    );

  const lifecycle: Array<[string, string, (ctx: Context, id: string) => Promise<Sandbox>, SandboxState | undefined]> = [
    ["start", "start a stopped, archived or paused sandbox and wait until it runs", (ctx, id) => ctx.client(SandboxService).startSandbox({ sandboxId: id }), SandboxState.STARTED],
    ["stop", "stop a sandbox (its files stay) and wait until it has stopped", (ctx, id) => ctx.client(SandboxService).stopSandbox({ sandboxId: id }), SandboxState.STOPPED],
    ["pause", "freeze a started sandbox's processes (start, or any call to it, resumes it)", (ctx, id) => ctx.client(SandboxService).pauseSandbox({ sandboxId: id }), SandboxState.PAUSED],
    ["archive", "archive a stopped sandbox", (ctx, id) => ctx.client(SandboxService).archiveSandbox({ sandboxId: id }), SandboxState.ARCHIVED],
    ["delete", "delete a sandbox and its files", (ctx, id) => ctx.client(SandboxService).deleteSandbox({ sandboxId: id }), undefined],
  ];
  for (const [name, description, call, target] of lifecycle) {
    const cmd = sandbox.command(name).description(description).argument("<sandbox>", "sandbox id or name");
    if (name === "delete") cmd.alias("rm");
    if (target !== undefined) cmd.option("--no-wait", "return at once").option(...timeout);
    cmd.action(
      run(async (id: string, o: { wait?: boolean; timeout?: number }, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        let s = await call(ctx, id);
        if (target !== undefined && o.wait !== false && s.state !== target) s = await waitFor(ctx, s.id, target, o.timeout ?? 300);
        if (target === undefined) ctx.out.result(asJson(SandboxSchema, s), () => console.log(`Deleted ${s.id}.`));
        else ctx.out.result(asJson(SandboxSchema, s), () => console.log(`${s.id}: ${stateLabel(s.state)}`));
      }),
    );
  }
}
