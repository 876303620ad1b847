// Where snapshot images come from (SANDBAR_REGISTRY_MIRROR, SANDBAR_INSECURE_REGISTRIES).

export interface RegistrySettings {
  /** host[:port] serving Docker Hub's repositories: unqualified and docker.io names are pulled from it. */
  mirror?: string;
  /** Registries reached over plain HTTP (or unverified TLS); loopback ones always are. */
  insecureRegistries: string[];
}

const HOST = /^(?:localhost|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?$/;

function host(name: string, raw: string): string {
  const v = raw.trim().toLowerCase();
  if (!HOST.test(v)) throw new Error(`${name} must be registry hosts (host or host:port, no scheme or path), got "${raw}"`);
  return v;
}

export function loadRegistrySettings(env: NodeJS.ProcessEnv): RegistrySettings {
  const mirror = env.SANDBAR_REGISTRY_MIRROR?.trim() ? host("SANDBAR_REGISTRY_MIRROR", env.SANDBAR_REGISTRY_MIRROR) : undefined;
  const insecure = (env.SANDBAR_INSECURE_REGISTRIES ?? "").split(",").filter((s) => s.trim() !== "").map((s) => host("SANDBAR_INSECURE_REGISTRIES", s));
  return { mirror, insecureRegistries: insecure };
}
