// The CLI's one door to @sandbar/sdk (its configuration, config file and errors). Imported from
// the workspace's source until the SDK's package entry point exists; then this becomes "@sandbar/sdk".
export * from "../../sdk/src/config.ts";
export * from "../../sdk/src/errors.ts";
