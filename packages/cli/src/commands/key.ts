import type { Command } from "commander";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { ApiKeyService } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import { Permission } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";
import { InvalidArgumentError } from "commander";
import { openContext } from "../context.ts";
import type { GlobalOptions } from "../global-options.ts";
import { run } from "../run.ts";
import { permissionName } from "./auth.ts";
import { positiveInt } from "./parse.ts";
import { when } from "./shared.ts";

const SCOPES = Object.values(Permission).filter((v): v is number => typeof v === "number" && v !== Permission.UNSPECIFIED);

/** "write:sandboxes" -> Permission.WRITE_SANDBOXES; an unknown scope is a usage error listing the known ones. */
function scope(value: string, previous: Permission[] = []): Permission[] {
  const found = SCOPES.find((p) => permissionName(p) === value.trim());
  if (found === undefined) throw new InvalidArgumentError(`unknown scope "${value}"; one of: ${SCOPES.map(permissionName).join(", ")}.`);
  return [...previous, found];
}

export function keyCommands(program: Command): void {
  const key = program.command("key").alias("keys").description("API keys of the organization");

  key
    .command("create")
    .description("create an API key; its value is shown once")
    .argument("<name>", "the key's name")
    .option("-s, --scope <scope>", "a permission, e.g. write:sandboxes (repeatable; default: all)", scope)
    .option("--expires-in <days>", "expire after this many days", positiveInt("--expires-in"))
    .action(
      run(async (name: string, o: { scope?: Permission[]; expiresIn?: number }, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        const expiresAt = o.expiresIn ? timestampFromDate(new Date(Date.now() + o.expiresIn * 86_400_000)) : undefined;
        const k = await ctx.client(ApiKeyService).createApiKey({ name, permissions: o.scope ?? SCOPES, expiresAt });
        ctx.out.result({ name: k.name, value: k.value, permissions: k.permissions.map(permissionName), expiresAt: when(k.expiresAt) || null }, () => {
          console.log(k.value);
          ctx.out.note(`Created key ${k.name} (${k.permissions.map(permissionName).join(", ")}). Its value is shown only this once.`);
        });
      }),
    );

  key
    .command("list")
    .alias("ls")
    .description("list keys (values masked)")
    .action(
      run(async (_o: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        const { items } = await ctx.client(ApiKeyService).listApiKeys({});
        const rows = items.map((k) => ({ name: k.name, value: k.value, permissions: k.permissions.map(permissionName).join(","), created: when(k.createdAt), expires: when(k.expiresAt), "last used": when(k.lastUsedAt) }));
        ctx.out.result(rows, () => ctx.out.table(rows, ["name", "value", "permissions", "created", "expires", "last used"]));
      }),
    );

  key
    .command("delete")
    .alias("rm")
    .description("delete (revoke) a key")
    .argument("<name>", "the key's name")
    .action(
      run(async (name: string, _o: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        await ctx.client(ApiKeyService).deleteApiKey({ name });
        ctx.out.result({ name, deleted: true }, () => console.log(`Deleted key ${name}.`));
      }),
    );
}
