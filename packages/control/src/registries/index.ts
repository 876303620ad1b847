// Container registries of organizations (spec 4.9): the API service, and the lookup the snapshot
// pull uses to find the credentials for an image's registry.
export { registryCredentialsFor } from "./credentials.ts";
export { dockerRegistryService } from "./service.ts";
export { startInternalRegistry } from "./internal/index.ts";
