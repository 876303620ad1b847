import { createWriteStream } from "node:fs";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { Command } from "commander";
import { SandboxChangeSchema, SandboxChangesService, type SandboxChange } from "@sandbar/protocol/gen/sandbar/control/v1/changes_pb.js";
import { openContext } from "../context.ts";
import { CliError } from "../failure.ts";
import type { GlobalOptions } from "../global-options.ts";
import { run } from "../run.ts";
import { asJson } from "./shared.ts";

// `sandbar changes`: what a sandbox changed since its creation (docs/changesets.md): a table of
// paths (every page), --json for scripts, --diff to stdout, --tar to a file (or - for stdout).

interface ChangesCliOptions {
  tar?: string;
  diff?: boolean;
  path?: string;
  consistent?: boolean;
  since?: string;
}

const COLUMNS = ["KIND", "TYPE", "SIZE", "PATH"];

export function changesCommand(program: Command): void {
  program
    .command("changes")
    .description("what a sandbox changed since its creation or a checkpoint: paths, a tar of the changed files, or a diff")
    .argument("<sandbox>", "sandbox id or name")
    .option("--tar <file>", "write the changed files as a tar (deletions as .wh.<name> entries); - for stdout")
    .option("--diff", "print a unified diff of the changed text files")
    .option("--path <prefix>", "only paths at or below this absolute path")
    .option("--consistent", "freeze the sandbox while its changes are read")
    .option("--since <snapshot>", "changes since a checkpoint: a snapshot (name or id) taken of this sandbox or an ancestor")
    .addHelpText("after", "\nExamples:\n  sandbar changes my-box\n  sandbar changes my-box --diff --path /home/sandbar\n  sandbar changes my-box --tar changes.tar")
    .action(
      run(async (sandboxId: string, o: ChangesCliOptions, globals: GlobalOptions) => {
        if (o.tar !== undefined && o.diff) throw new CliError("Choose one of --tar and --diff.", 2);
        const ctx = await openContext(globals);
        const client = ctx.client(SandboxChangesService);
        const common = { sandboxId, pathPrefix: o.path, consistent: o.consistent, since: o.since };
        if (o.tar !== undefined || o.diff) {
          const format = o.diff ? "diff" : "tar";
          const bytes = (async function* () {
            for await (const chunk of client.exportSandboxChanges({ ...common, format })) yield chunk.data;
          })();
          // The file is made once the first bytes came, so a refusal leaves nothing behind.
          const first = await bytes.next();
          const rest = (async function* () {
            if (!first.done) yield first.value;
            yield* bytes;
          })();
          const toStdout = o.diff || o.tar === "-";
          await pipeline(Readable.from(rest), toStdout ? process.stdout : createWriteStream(o.tar!), toStdout ? { end: false } : {});
          if (!toStdout) ctx.out.note(`Wrote the changes of ${sandboxId} to ${o.tar}.`);
          return;
        }
        const items: SandboxChange[] = [];
        let cursor: string | undefined;
        do {
          const page = await client.listSandboxChanges({ ...common, cursor });
          items.push(...page.items);
          cursor = page.nextCursor;
        } while (cursor);
        ctx.out.result(items.map((c) => asJson(SandboxChangeSchema, c)), () =>
          items.length ? ctx.out.table(items.map((c) => ({ KIND: c.kind, TYPE: c.type, SIZE: String(c.size), PATH: c.path })), COLUMNS) : ctx.out.note("No changes."),
        );
      }),
    );
}
