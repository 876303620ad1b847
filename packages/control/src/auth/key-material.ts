import { hash, randomBytes } from "node:crypto";

/** Sandbar API keys: "sbr_" and 64 hex digits (256 random bits). */
const KEY_PREFIX = "sbr_";
const MASK = "*".repeat(20);

export function generateApiKey(): string {
  return KEY_PREFIX + randomBytes(32).toString("hex");
}

/** The only stored form of a key: its SHA-256, which is also how a presented key is looked up. */
export function hashApiKey(value: string): string {
  return hash("sha256", value, "hex");
}

/** The parts kept for masking: 3 characters at each end, as the reference does. */
export function keyEnds(value: string): { prefix: string; suffix: string } {
  return { prefix: value.slice(0, 3), suffix: value.slice(-3) };
}

export function maskApiKey(prefix: string, suffix: string): string {
  return prefix + MASK + suffix;
}

const JWT_SHAPE = /^eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/;
export const looksLikeJwt = (token: string) => JWT_SHAPE.test(token);
