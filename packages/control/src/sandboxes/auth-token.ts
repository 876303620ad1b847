import { createHash, randomBytes, timingSafeEqual } from "node:crypto";

// A sandbox's preview token: given at create and at every start, checked by the preview proxy
// and by the toolbox for clients that hold no API key.

/** A fresh preview token: 32 lower-case alphanumerics, like the reference's. */
export function newAuthToken(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  const bytes = randomBytes(32);
  let out = "";
  for (const b of bytes) out += alphabet[b % alphabet.length];
  return out;
}

/** Whether `given` is the sandbox's current preview token (constant time in content and length). */
export function isAuthToken(authToken: string, given: string): boolean {
  const digest = (v: string) => createHash("sha256").update(v).digest();
  return timingSafeEqual(digest(given), digest(authToken));
}
