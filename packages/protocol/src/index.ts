export * from "./errors.ts";
export * from "./routes.ts";
export * from "./services.ts";
export * from "./tunnel.ts";
export * from "./limits.ts";
