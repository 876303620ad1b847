import { randomBytes } from "node:crypto";
import type { ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import type { SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import type { SecretBox } from "../auth/secret-box.ts";
import { organizationOf } from "../call/call.ts";
import { SandboxRecord } from "../db/entities.ts";
import type { SignedUrlKeys } from "../toolbox/rest/signed-file-url.ts";
import type { SandboxManager } from "./manager.ts";
import { isErrored } from "./states.ts";

// The key each sandbox's signed file URLs are made with (the 0.218 client's downloadUrl and
// uploadUrl sign `v1:files:<method>:<path>:<expires>` with it, HMAC-SHA256): one per sandbox,
// made on first read, kept sealed with the server's secret box, replaced by rotate (which
// invalidates every URL signed before). Checked by toolbox/rest/signed-file-url.ts.

export class SigningKeys {
  readonly #orm: MikroORM;
  readonly #box: SecretBox;

  constructor(orm: MikroORM, box: SecretBox) {
    this.#orm = orm;
    this.#box = box;
  }

  /** The sandbox's key, made now if it has none (two first reads at once agree on one). */
  async get(id: string): Promise<string> {
    const em = this.#orm.em.fork();
    await em.nativeUpdate(SandboxRecord, { id, signingKeySealed: null }, { signingKeySealed: this.#box.seal(newKey()) });
    return (await this.current(id))!;
  }

  /** A new key; URLs signed with the old one are refused from now on. */
  async rotate(id: string): Promise<string> {
    const key = newKey();
    await this.#orm.em.fork().nativeUpdate(SandboxRecord, { id }, { signingKeySealed: this.#box.seal(key) });
    return key;
  }

  /** The key, or undefined when the sandbox has none yet (no URL can be valid then). */
  async current(id: string): Promise<string | undefined> {
    const row = await this.#orm.em.fork().findOne(SandboxRecord, { id }, { fields: ["signingKeySealed"] });
    return row?.signingKeySealed ? this.#box.open(row.signingKeySealed) : undefined;
  }
}

/** 32 random bytes, as the client's HMAC key (a string). */
const newKey = () => randomBytes(32).toString("base64url");

/** SandboxService's two signing-key methods: the caller's sandbox (404 for another organization's), its key as a bare string. */
export function signingKeyMethods(manager: SandboxManager, keys: SigningKeys): Partial<ServiceImpl<typeof SandboxService>> {
  return {
    async getSandboxSigningKey(req, ctx) {
      const row = await manager.get(organizationOf(ctx), req.sandboxId);
      return { key: await keys.get(row.id) };
    },
    async rotateSigningKey(req, ctx) {
      const row = await manager.get(organizationOf(ctx), req.sandboxId);
      return { key: await keys.rotate(row.id) };
    },
  };
}

/** What a signed file URL is checked with: the sandbox (not deleted) and its key. */
export function signedUrlKeys(manager: SandboxManager, keys: SigningKeys): SignedUrlKeys {
  return {
    async holder(sandboxId) {
      const row = await manager.store.byId(sandboxId);
      if (!row || row.state === "destroyed" || (isErrored(row.state) && row.desiredState === "destroyed")) return undefined;
      return { organizationId: row.organizationId, key: row.signingKeySealed ? await keys.current(row.id) : undefined };
    },
  };
}
