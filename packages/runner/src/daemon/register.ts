import { createHash } from "node:crypto";
import { readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import type { RunnerHostSettings } from "./settings.ts";

// What a runner checks control's bearer against: the SHA-256 of its credential, never the
// credential itself. Given SANDBAR_RUNNER_CREDENTIAL, its hash; otherwise the runner registers
// itself once through the runners API (POST /runners with an API key that has write:runners),
// keeps the hash of the credential control answered in `<data dir>/runner-credential.sha256`
// (0600), and forgets the credential: later starts read the file and do not register again.

const FILE = "runner-credential.sha256";

export async function credentialHash(dataDir: string, s: RunnerHostSettings, log: (line: string) => void): Promise<Buffer> {
  if (s.credential) return sha256(s.credential);
  const file = path.join(dataDir, FILE);
  const kept = await readFile(file, "utf8").then((t) => t.trim(), () => undefined);
  if (kept !== undefined) {
    if (!/^[0-9a-f]{64}$/.test(kept)) throw new Error(`${file} is not a SHA-256 (64 hex digits)`);
    return Buffer.from(kept, "hex");
  }
  const r = s.registration!;
  const res = await fetch(`${r.controlUrl}/api/runners`, {
    method: "POST",
    headers: { authorization: `Bearer ${r.key}`, "content-type": "application/json" },
    body: JSON.stringify({ regionId: r.region, name: r.name, apiUrl: r.advertiseUrl }),
  });
  const body = (await res.json().catch(() => ({}))) as { id?: string; apiKey?: string; message?: string };
  if (res.status !== 201 || !body.apiKey) throw new Error(`registering with ${r.controlUrl} failed: ${res.status} ${body.message ?? ""}`.trim());
  const hash = sha256(body.apiKey);
  await writeFile(file, hash.toString("hex") + "\n", { mode: 0o600, flag: "wx" });
  log(`registered as runner ${body.id} (${r.name}) in region ${r.region}, reached at ${r.advertiseUrl}`);
  return hash;
}

function sha256(value: string): Buffer {
  return createHash("sha256").update(value).digest();
}
