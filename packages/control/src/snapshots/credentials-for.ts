import type { RegistryCredentials } from "@sandbar/runner/images";

// Its own module because both the pulls and the builder take it: the builder once imported it
// from pulls.ts while pulls.ts imported the builder, an import cycle.

/**
 * Credentials for `registry` (host[:port], the one actually contacted: the mirror for Docker Hub
 * names when one is set) as the organization's registries hold them. The registries API connects here.
 */
export type CredentialsFor = (organizationId: string, registry: string) => Promise<RegistryCredentials | undefined>;
