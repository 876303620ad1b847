import type { Command } from "commander";
import { VolumeSchema, VolumeService, VolumeState, type Volume } from "@sandbar/protocol/gen/sandbar/control/v1/volume_pb.js";
import { openContext } from "../context.ts";
import type { GlobalOptions } from "../global-options.ts";
import { run } from "../run.ts";
import { asJson, enumLabel, when } from "./shared.ts";

const row = (v: Volume) => ({ id: v.id, name: v.name, state: enumLabel(VolumeState, v.state, "VOLUME_STATE_"), created: when(v.createdAt) });

export function volumeCommands(program: Command): void {
  const volume = program.command("volume").alias("volumes").description("volumes: storage shared by sandboxes (mount with `sandbox create --volume`)");

  volume
    .command("create")
    .description("create a volume")
    .argument("[name]", "a name unique in the organization; default: its id")
    .action(
      run(async (name: string | undefined, _o: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        const v = await ctx.client(VolumeService).createVolume({ name: name ?? "" });
        ctx.out.result(asJson(VolumeSchema, v), () => console.log(`Created volume ${v.name} (${v.id}).`));
      }),
    );

  volume
    .command("list")
    .alias("ls")
    .description("list volumes")
    .action(
      run(async (_o: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        const { items } = await ctx.client(VolumeService).listVolumes({});
        ctx.out.result(items.map((v) => asJson(VolumeSchema, v)), () => (items.length ? ctx.out.table(items.map(row), ["id", "name", "state", "created"]) : ctx.out.note("No volumes.")));
      }),
    );

  volume
    .command("get")
    .description("show a volume")
    .argument("<volume>", "volume id or name")
    .action(
      run(async (id: string, _o: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        const client = ctx.client(VolumeService);
        const v = await client.getVolume({ volumeId: id }).catch((err) => client.getVolumeByName({ name: id }).catch(() => Promise.reject(err)));
        ctx.out.result(asJson(VolumeSchema, v), () => ctx.out.table([row(v)], ["id", "name", "state", "created"]));
      }),
    );

  volume
    .command("delete")
    .alias("rm")
    .description("delete a volume (it must not be mounted)")
    .argument("<volume>", "volume id")
    .action(
      run(async (id: string, _o: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        await ctx.client(VolumeService).deleteVolume({ volumeId: id });
        ctx.out.result({ id, deleted: true }, () => console.log(`Deleted volume ${id}.`));
      }),
    );
}
