import { Migration } from "@mikro-orm/migrations";

/**
 * Short-lived credentials of the internal registry (GET /docker-registry/registry-push-access,
 * and the ones snapshot pulls present): the registry's token service checks a username and
 * secret against these rows. Only a SHA-256 of the secret is kept (it is 256 random bits, so a
 * slow hash adds nothing); `actions` is what the credential may do in its organization's
 * namespace ("pull,push" or "pull"). Expired rows are swept when new ones are issued.
 */
export class Migration0017RegistryPushCredentials extends Migration {
  override name = "0017-registry-push-credentials";

  override up(): void {
    this.addSql(`create table "registry_push_credential" (
      "id" uuid primary key default gen_random_uuid(),
      "organization_id" uuid not null references "organization" ("id") on delete cascade,
      "username" varchar(64) not null unique,
      "secret_hash" char(64) not null,
      "actions" varchar(32) not null check ("actions" in ('pull', 'pull,push')),
      "expires_at" timestamptz(3) not null,
      "created_at" timestamptz(3) not null default clock_timestamp())`);
    this.addSql(`create index "registry_push_credential_expires_at_index" on "registry_push_credential" ("expires_at")`);
  }
}
