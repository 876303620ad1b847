// Container registries of organizations (spec 4.9): the API service, and the lookup the snapshot
// pull uses to find the credentials for an image's registry.
export { registryCredentialsFor, type RegistryCredentials } from "./credentials.ts";
export { dockerRegistryService, MAX_REGISTRIES_PER_ORGANIZATION } from "./service.ts";
export { canonicalRegistryHost, DOCKER_HUB, parseRegistryUrl } from "./url.ts";
export { loadInternalRegistrySettings, startInternalRegistry, type InternalRegistry, type InternalRegistrySettings } from "./internal/index.ts";
