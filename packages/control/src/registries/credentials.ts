import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import type { SecretBox } from "../auth/secret-box.ts";
import { type Exec, execIn } from "../db/exec.ts";
import { canonicalRegistryHost, hostOfRegistryUrl } from "./url.ts";

export interface RegistryCredentials {
  username: string;
  password: string;
}

/**
 * The credentials a pull of an image from `registryHost` (an image reference's registry part,
 * e.g. "ghcr.io", "127.0.0.1:5000" or "docker.io") presents for the organization: those of its
 * registry whose URL names the same host (Docker Hub under any of its names). When several do,
 * the default wins, then the newest. Undefined when none does: the pull goes anonymous.
 * `db` is the ORM, or an Exec to read inside the caller's transaction.
 */
export async function registryCredentialsFor(db: MikroORM | Exec, organizationId: string, registryHost: string, box: SecretBox): Promise<RegistryCredentials | undefined> {
  const exec = typeof db === "function" ? db : execIn(db.em.fork());
  const rows = (await exec(
    `select name, url, username, password_sealed from docker_registry
      where organization_id = ? and registry_type = 'organization'
      order by is_default desc, created_at desc, id desc`,
    [organizationId],
  )) as Array<{ name: string; url: string; username: string; password_sealed: string }>;
  const wanted = canonicalRegistryHost(registryHost);
  const match = rows.find((r) => hostOfRegistryUrl(r.url) === wanted);
  if (!match) return undefined;
  let password: string;
  try {
    password = box.open(match.password_sealed);
  } catch {
    // Sealed under another key: SANDBAR_ENCRYPTION_KEY changed since the registry was saved.
    throw errors.failedPrecondition(`The password of registry ${match.name} cannot be decrypted: set it again with PATCH /docker-registry/{id}`);
  }
  return { username: match.username, password };
}
