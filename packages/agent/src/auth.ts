import { createHash, timingSafeEqual } from "node:crypto";
import type { Interceptor } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";

const digest = (s: string) => createHash("sha256").update(s).digest();

/**
 * Refuses every call whose `authorization` metadata is not `Bearer <secret>`.
 * Compares digests in constant time, so neither content nor length leaks.
 */
export function requireSecret(secret: string): Interceptor {
  const expected = digest(`Bearer ${secret}`);
  return (next) => async (req) => {
    const given = req.header.get("authorization");
    if (given === null || !timingSafeEqual(digest(given), expected)) throw errors.unauthenticated();
    return next(req);
  };
}
