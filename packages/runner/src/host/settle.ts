/**
 * Promise.all that waits for every promise before it throws the first failure: nothing is still
 * working on a sandbox's root or mounts when the failure is cleaned up.
 */
export async function settleAll<T extends readonly unknown[]>(ps: { readonly [K in keyof T]: Promise<T[K]> }): Promise<T> {
  const results = await Promise.allSettled(ps as readonly Promise<unknown>[]);
  const values: unknown[] = [];
  for (const r of results) {
    if (r.status === "rejected") throw r.reason;
    values.push(r.value);
  }
  return values as unknown as T;
}
