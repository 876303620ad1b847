import { Migration } from "@mikro-orm/migrations";

/**
 * Container registries an organization pulls images from. The password is sealed with the
 * SecretBox (AES-256-GCM): the server must present it to the registry, so a hash would not do.
 * At most one default per organization, held by the partial unique index rather than by code.
 */
export class Migration0012DockerRegistries extends Migration {
  override name = "0012-docker-registries";

  override up(): void {
    this.addSql(`create table "docker_registry" (
      "id" uuid primary key default gen_random_uuid(),
      "organization_id" uuid null references "organization" ("id") on delete cascade,
      "name" varchar(255) not null,
      "url" varchar(2048) not null,
      "username" text not null,
      "password_sealed" text not null,
      "project" varchar(255) not null default '',
      "registry_type" varchar(16) not null default 'organization'
        check ("registry_type" in ('internal', 'organization', 'transient', 'backup')),
      "is_default" boolean not null default false,
      "created_at" timestamptz(3) not null default clock_timestamp(),
      "updated_at" timestamptz(3) not null default clock_timestamp())`);
    this.addSql(`create index "docker_registry_organization_id_created_at_index" on "docker_registry" ("organization_id", "created_at")`);
    this.addSql(`create unique index "docker_registry_one_default_per_organization" on "docker_registry" ("organization_id") where "is_default"`);
  }
}
