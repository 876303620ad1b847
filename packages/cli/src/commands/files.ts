import { createReadStream, createWriteStream } from "node:fs";
import { stat } from "node:fs/promises";
import { basename, join, posix } from "node:path";
import { pipeline } from "node:stream/promises";
import type { Command } from "commander";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { FileService, type UploadFileRequestSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { openContext } from "../context.ts";
import type { GlobalOptions } from "../global-options.ts";
import { CliError } from "../failure.ts";
import { progressBar } from "../progress.ts";
import { run } from "../run.ts";

/** `SANDBOX:/path` names a file in a sandbox; anything else is local (./a:b is local, as scp does). */
export function parseRemote(arg: string): { sandbox: string; path: string } | undefined {
  const m = /^([A-Za-z0-9][\w.-]*):(.*)$/.exec(arg);
  if (!m || arg.startsWith("./") || arg.startsWith("/")) return undefined;
  return { sandbox: m[1]!, path: m[2] === "" ? "." : m[2]! };
}

async function localKind(path: string): Promise<"dir" | "file" | "missing"> {
  try {
    return (await stat(path)).isDirectory() ? "dir" : "file";
  } catch {
    return "missing";
  }
}

export function filesCommands(program: Command): void {
  program
    .command("cp")
    .description("copy a file into or out of a sandbox, streamed (a progress bar on a terminal)")
    .argument("<source>", "./local/file or SANDBOX:/path")
    .argument("<destination>", "SANDBOX:/path or ./local/file (a directory or a path ending in / keeps the name)")
    .addHelpText("after", "\nExamples:\n  sandbar cp ./data.csv my-box:/home/sandbar/\n  sandbar cp my-box:/var/log/app.log ./app.log")
    .action(
      run(async (source: string, destination: string, _o: unknown, globals: GlobalOptions) => {
        const from = parseRemote(source);
        const to = parseRemote(destination);
        if (from && to) throw new CliError("Copy between two sandboxes is not supported: copy to this machine first.", 2);
        if (!from && !to) throw new CliError("One side must be a sandbox path (SANDBOX:/path): for local copies use cp.", 2);
        const ctx = await openContext(globals);

        if (to) {
          const kind = await localKind(source);
          if (kind !== "file") throw new CliError(kind === "dir" ? `${source} is a directory: only files can be copied.` : `${source}: no such file.`, 1);
          const size = (await stat(source)).size;
          const files = ctx.client(FileService, to.sandbox);
          // Into a directory (named with a trailing / or existing there), the file keeps its name.
          const intoDir = to.path.endsWith("/") || (await files.getFileInfo({ path: to.path }).then((i) => i.isDir, () => false));
          const path = intoDir ? posix.join(to.path, basename(source)) : to.path;
          const bar = progressBar(basename(source), size);
          async function* messages(): AsyncGenerator<MessageInitShape<typeof UploadFileRequestSchema>> {
            yield { part: { case: "header", value: { path } } };
            for await (const chunk of createReadStream(source, { highWaterMark: 256 * 1024 }) as AsyncIterable<Buffer>) {
              bar.add(chunk.length);
              yield { part: { case: "data", value: chunk } };
            }
          }
          const res = await files.uploadFile(messages());
          bar.done();
          ctx.out.result({ sandbox: to.sandbox, path: res.file?.path ?? path, bytes: Number(res.file?.bytes ?? size) }, () => ctx.out.note(`Copied ${source} to ${to.sandbox}:${res.file?.path ?? path}.`));
          return;
        }

        const remote = from!;
        const target = (await localKind(destination)) === "dir" || destination.endsWith("/") ? join(destination, posix.basename(remote.path)) : destination;
        const stream = ctx.client(FileService, remote.sandbox).downloadFile({ path: remote.path });
        let bar = progressBar(posix.basename(remote.path), undefined);
        let bytes = 0;
        async function* data(): AsyncGenerator<Uint8Array> {
          for await (const part of stream) {
            if (part.part.case === "info") {
              if (part.part.value.isDir) throw new CliError(`${remote.sandbox}:${remote.path} is a directory: only files can be copied.`);
              bar = progressBar(posix.basename(remote.path), Number(part.part.value.size));
            } else if (part.part.case === "data") {
              bytes += part.part.value.length;
              bar.add(part.part.value.length);
              yield part.part.value;
            }
          }
        }
        // The file is created only once the first message arrived, so a missing remote file leaves nothing behind.
        const iterator = data();
        const first = await iterator.next();
        const out = createWriteStream(target);
        await pipeline(
          (async function* () {
            if (!first.done) yield first.value;
            yield* iterator;
          })(),
          out,
        );
        bar.done();
        ctx.out.result({ sandbox: remote.sandbox, path: remote.path, file: target, bytes }, () => ctx.out.note(`Copied ${remote.sandbox}:${remote.path} to ${target}.`));
      }),
    );
}
