/**
 * Promise.all that waits for every promise before it throws the first failure: nothing is still
 * working on a sandbox's root or mounts when the failure is cleaned up.
 */
export async function settleAll<T extends readonly unknown[]>(ps: { readonly [K in keyof T]: Promise<T[K]> }): Promise<T> {
  await Promise.allSettled(ps);
  // All settled: Promise.all now answers at once, with the first failure in order if any.
  return Promise.all(ps);
}
