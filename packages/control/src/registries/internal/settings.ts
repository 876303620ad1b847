// The registry users push to (SANDBAR_INTERNAL_REGISTRY, SANDBAR_PUSH_REGISTRY): by default one this
// server runs on a loopback `host:port` (port 0: any free port, for tests); or an external one
// whose token auth points at this server's token service (SANDBAR_REGISTRY_TOKEN_ADDR); or off.

interface Address {
  host: string;
  port: number;
}

export type InternalRegistrySettings =
  | { enabled: false }
  | ({ enabled: true } & Address)
  | { enabled: true; external: string; tokenService: Address };

export const DEFAULT_INTERNAL_REGISTRY = "127.0.0.1:5050";
const DEFAULT_TOKEN_ADDR = "0.0.0.0:5051";

const LOOPBACK = /^(?:127\.\d{1,3}\.\d{1,3}\.\d{1,3}|localhost)$/;
const HOST_PORT = /^((?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*|\d{1,3}(?:\.\d{1,3}){3}):(\d{1,5})$/;

function address(name: string, raw: string, loopbackOnly: boolean, example: string): Address {
  const m = HOST_PORT.exec(raw.trim().toLowerCase());
  const port = Number(m?.[2]);
  if (!m || port > 65535 || (loopbackOnly && !LOOPBACK.test(m[1]!))) {
    throw new Error(`${name} must be ${loopbackOnly ? "off or a loopback" : "a"} host:port (e.g. ${example}), got "${raw}"`);
  }
  return { host: m[1] === "localhost" ? "127.0.0.1" : m[1]!, port };
}

export function loadInternalRegistrySettings(env: NodeJS.ProcessEnv): InternalRegistrySettings {
  const external = env.SANDBAR_PUSH_REGISTRY?.trim();
  if (external) {
    const ext = address("SANDBAR_PUSH_REGISTRY", external, false, "registry.example.com:5000");
    if (ext.port === 0) throw new Error(`SANDBAR_PUSH_REGISTRY must name the registry's port, got "${external}"`);
    return { enabled: true, external: `${ext.host}:${ext.port}`, tokenService: address("SANDBAR_REGISTRY_TOKEN_ADDR", env.SANDBAR_REGISTRY_TOKEN_ADDR?.trim() || DEFAULT_TOKEN_ADDR, false, DEFAULT_TOKEN_ADDR) };
  }
  const raw = (env.SANDBAR_INTERNAL_REGISTRY ?? "").trim() || DEFAULT_INTERNAL_REGISTRY;
  if (raw.toLowerCase() === "off") return { enabled: false };
  // Loopback only: the embedded registry speaks plain HTTP and its token realm is on loopback.
  return { enabled: true, ...address("SANDBAR_INTERNAL_REGISTRY", raw, true, DEFAULT_INTERNAL_REGISTRY) };
}
