export * from "./errors.ts";
