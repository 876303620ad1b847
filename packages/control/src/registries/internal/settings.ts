// Where the internal registry listens (SANDBAR_INTERNAL_REGISTRY): a loopback `host:port`
// (port 0: any free port, for tests), or `off`.

export type InternalRegistrySettings = { enabled: false } | { enabled: true; host: string; port: number };

export const DEFAULT_INTERNAL_REGISTRY = "127.0.0.1:5050";

const LOOPBACK = /^(?:127\.\d{1,3}\.\d{1,3}\.\d{1,3}|localhost)$/;

export function loadInternalRegistrySettings(env: NodeJS.ProcessEnv): InternalRegistrySettings {
  const raw = (env.SANDBAR_INTERNAL_REGISTRY ?? "").trim() || DEFAULT_INTERNAL_REGISTRY;
  if (raw.toLowerCase() === "off") return { enabled: false };
  const m = /^([^:]+):(\d{1,5})$/.exec(raw);
  const port = Number(m?.[2]);
  // Loopback only: the registry's token realm and plain HTTP are only safe there.
  if (!m || !LOOPBACK.test(m[1]!) || port > 65535) {
    throw new Error(`SANDBAR_INTERNAL_REGISTRY must be off or a loopback host:port (e.g. ${DEFAULT_INTERNAL_REGISTRY}), got "${raw}"`);
  }
  return { enabled: true, host: m[1] === "localhost" ? "127.0.0.1" : m[1]!, port };
}
