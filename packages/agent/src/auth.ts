import { createHash, timingSafeEqual } from "node:crypto";
import type { Interceptor } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";

const digest = (s: string) => createHash("sha256").update(s).digest();

/**
 * Refuses every call whose `authorization` metadata is not `Bearer <secret>`.
 * Compares digests in constant time, so neither content nor length leaks.
 */
export function requireSecret(secret: string): Interceptor {
  const authorized = secretCheck(secret);
  return (next) => async (req) => {
    if (!authorized(req.header.get("authorization"))) throw errors.unauthenticated();
    return next(req);
  };
}

/** Whether an `authorization` value is `Bearer <secret>` (the same constant-time check, for calls served outside Connect). */
export function secretCheck(secret: string): (authorization: string | null | undefined) => boolean {
  const expected = digest(`Bearer ${secret}`);
  return (given) => typeof given === "string" && timingSafeEqual(digest(given), expected);
}
