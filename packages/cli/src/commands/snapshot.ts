import type { Command } from "commander";
import { SnapshotSchema, SnapshotService, SnapshotState, type Snapshot } from "@sandbar/protocol/gen/sandbar/control/v1/snapshot_pb.js";
import { openContext, type Context } from "../context.ts";
import type { GlobalOptions } from "../global-options.ts";
import { CliError } from "../failure.ts";
import { run } from "../run.ts";
import { collect, positiveInt } from "./parse.ts";
import { asJson, enumLabel, sleep, when } from "./shared.ts";

const stateLabel = (s: SnapshotState) => enumLabel(SnapshotState, s, "SNAPSHOT_STATE_");
const SETTLED = new Set([SnapshotState.ACTIVE, SnapshotState.INACTIVE, SnapshotState.ERROR, SnapshotState.BUILD_FAILED]);

const row = (s: Snapshot) => ({ id: s.id, name: s.name, state: stateLabel(s.state), image: s.imageName ?? "", size: s.size === undefined ? "" : `${s.size.toFixed(2)}G`, created: when(s.createdAt) });

async function waitSettled(ctx: Context, id: string, timeoutSec: number): Promise<Snapshot> {
  const deadline = Date.now() + timeoutSec * 1000;
  for (;;) {
    const s = await ctx.client(SnapshotService).getSnapshot({ id });
    if (SETTLED.has(s.state)) return s;
    if (Date.now() > deadline) throw new CliError(`Snapshot ${s.name} is still ${stateLabel(s.state)} after ${timeoutSec} s: check with \`sandbar snapshot list\`.`);
    await sleep(500);
  }
}

export function snapshotCommands(program: Command): void {
  const snapshot = program.command("snapshot").alias("snapshots").description("snapshots sandboxes boot from");

  snapshot
    .command("create")
    .description("create a snapshot from an OCI image, following its build log until it is ready")
    .argument("<name>", "the snapshot's name")
    .requiredOption("--image <image>", "the image, e.g. python:3.12 or registry.example/team/app:1")
    .option("--cpu <n>", "default cores of its sandboxes", positiveInt("--cpu"))
    .option("--memory <gib>", "default memory (GiB)", positiveInt("--memory"))
    .option("--disk <gib>", "default disk (GiB)", positiveInt("--disk"))
    .option("--entrypoint <word>", "entrypoint word (repeatable)", collect)
    .option("--no-wait", "return once accepted, without following the build")
    .option("--timeout <seconds>", "how long to follow the build", positiveInt("--timeout"), 1800)
    .action(
      run(async (name: string, o: { image: string; cpu?: number; memory?: number; disk?: number; entrypoint?: string[]; wait: boolean; timeout: number }, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        const snapshots = ctx.client(SnapshotService);
        let s = await snapshots.createSnapshot({ name, imageName: o.image, cpu: o.cpu, memory: o.memory, disk: o.disk, entrypoint: o.entrypoint ?? [] });
        if (o.wait) {
          ctx.out.note(ctx.out.paint("dim", `Building ${s.name} from ${o.image}:`));
          // Build log lines go to stderr with --json, so stdout stays one JSON document.
          const log = ctx.out.json ? process.stderr : process.stdout;
          for await (const chunk of snapshots.getSnapshotBuildLogs({ id: s.id, follow: true }, { timeoutMs: o.timeout * 1000 })) log.write(chunk.data);
          s = await waitSettled(ctx, s.id, 60);
          if (s.state !== SnapshotState.ACTIVE) throw new CliError(`Snapshot ${s.name} is ${stateLabel(s.state)}${s.errorReason ? `: ${s.errorReason}` : ""}.`);
        }
        ctx.out.result(asJson(SnapshotSchema, s), () => console.log(`${ctx.out.paint("green", "✓")} snapshot ${s.name} (${s.id}): ${stateLabel(s.state)}`));
      }),
    );

  snapshot
    .command("list")
    .alias("ls")
    .description("list the snapshots you can use")
    .action(
      run(async (_o: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        const items: Snapshot[] = [];
        for (let page = 1; ; page++) {
          const res = await ctx.client(SnapshotService).listSnapshots({ page, limit: 100 });
          items.push(...res.items);
          if (page >= res.totalPages || res.items.length === 0) break;
        }
        ctx.out.result(items.map((s) => asJson(SnapshotSchema, s)), () => (items.length ? ctx.out.table(items.map(row), ["id", "name", "state", "image", "size", "created"]) : ctx.out.note("No snapshots.")));
      }),
    );

  snapshot
    .command("logs")
    .description("print a snapshot's build log (-f: follow it)")
    .argument("<snapshot>", "snapshot id or name")
    .option("-f, --follow", "keep printing until the build ends")
    .action(
      run(async (id: string, o: { follow?: boolean }, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        for await (const chunk of ctx.client(SnapshotService).getSnapshotBuildLogs({ id, follow: Boolean(o.follow) })) process.stdout.write(chunk.data);
      }),
    );

  snapshot
    .command("delete")
    .alias("rm")
    .description("delete a snapshot")
    .argument("<snapshot>", "snapshot id or name")
    .action(
      run(async (id: string, _o: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        await ctx.client(SnapshotService).deleteSnapshot({ id });
        ctx.out.result({ id, deleted: true }, () => console.log(`Deleted snapshot ${id}.`));
      }),
    );
}
