import { MikroORM } from "@mikro-orm/postgresql";
import { Migrator } from "@mikro-orm/migrations";
import { entities } from "./entities.ts";
import { migrations } from "./migrations/index.ts";

/** Connects to PostgreSQL and applies pending migrations. */
export async function openDatabase(clientUrl: string): Promise<MikroORM> {
  const orm = await MikroORM.init({
    clientUrl,
    entities,
    extensions: [Migrator],
    migrations: { migrationsList: migrations, snapshot: false, snapshotOnMigrate: false, silent: true },
    pool: { min: 1, max: 10 },
    debug: false,
  });
  await orm.migrator.up();
  return orm;
}
