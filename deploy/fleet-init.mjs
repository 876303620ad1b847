// One-shot setup of the docker-compose fleet, run once control answers: the region the runners
// join ("fleet", made if missing) and an API key that may only register runners
// (write:runners), written to the shared config volume for the runners to read. Idempotent: a
// second run finds both and writes nothing. Uses the bootstrap key; nothing else is kept.
import { existsSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";

const api = process.env.SANDBAR_CONTROL_URL ?? "http://lb:3000";
const key = process.env.SANDBAR_BOOTSTRAP_API_KEY;
const dir = process.env.FLEET_CONFIG_DIR ?? "/fleet";
const name = process.env.FLEET_REGION ?? "fleet";
if (!key) throw new Error("SANDBAR_BOOTSTRAP_API_KEY is required");

async function call(method, p, body) {
  // A replica still starting behind the balancer closes the connection: asked again.
  let res;
  for (let i = 0; ; i++) {
    try {
      res = await fetch(`${api}/api${p}`, { method, headers: { authorization: `Bearer ${key}`, ...(body ? { "content-type": "application/json" } : {}) }, body: body && JSON.stringify(body) });
      break;
    } catch (err) {
      if (i === 120) throw err;
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
  const json = await res.json().catch(() => ({}));
  if (res.status >= 300) throw new Error(`${method} ${p}: ${res.status} ${json.message ?? ""}`);
  return json;
}

for (let i = 0; ; i++) {
  try {
    await call("GET", "/regions");
    break;
  } catch (err) {
    if (i === 120) throw err;
    await new Promise((r) => setTimeout(r, 1000));
  }
}
await mkdir(dir, { recursive: true });
const regionFile = path.join(dir, "region");
const keyFile = path.join(dir, "runner-registration-key");
if (!existsSync(regionFile)) {
  const regions = await call("GET", "/regions");
  const region = regions.find((r) => r.name === name) ?? (await call("POST", "/regions", { name }));
  await writeFile(regionFile, region.id + "\n");
  console.log(`fleet: region ${name} is ${region.id}`);
}
if (!existsSync(keyFile)) {
  const made = await call("POST", "/api-keys", { name: `fleet-runners-${Date.now()}`, permissions: ["write:runners"] });
  await writeFile(keyFile, made.value + "\n", { mode: 0o600 });
  console.log("fleet: a write:runners key for the runners is in the config volume");
}
