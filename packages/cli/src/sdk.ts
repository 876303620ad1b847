// The CLI's one door to @sandbar/sdk (configuration, config file, transport, clients, errors).
// Imported from the workspace's source: the package's entry point is its built dist/, which a
// checkout run with `node packages/cli/src/main.ts` does not have.
export * from "../../sdk/src/index.ts";
