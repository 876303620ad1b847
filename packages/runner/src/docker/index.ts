export type { DockerProviderOptions } from "./provider.ts";
export { DockerProvider } from "./provider.ts";
