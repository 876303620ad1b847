import type { Settings } from "../settings.ts";
import { PATH_PREFIX } from "./address.ts";

/**
 * The preview URLs the API hands out. With SANDBAR_PREVIEW_DOMAIN (wildcard DNS pointing at this
 * server): `{scheme}://{port}-{id}.{domain}[:{public port}]`. Without: the path form under the
 * public URL, which works wherever the API does. `id` is a sandbox id or a signed URL's token.
 */
export class PreviewUrls {
  readonly #publicUrl: URL;
  /** The domain the host form is served under. */
  readonly domain: string;
  readonly #wildcard: boolean;

  constructor(settings: Pick<Settings, "publicUrl" | "previewDomain">) {
    this.#publicUrl = new URL(settings.publicUrl);
    this.domain = settings.previewDomain ?? `preview.${this.#publicUrl.hostname.replace(/^\[|\]$/g, "")}`;
    this.#wildcard = settings.previewDomain !== undefined;
  }

  get secure(): boolean {
    return this.#publicUrl.protocol === "https:";
  }

  portUrl(id: string, port: number): string {
    if (this.#wildcard) {
      const u = this.#publicUrl;
      return `${u.protocol}//${port}-${id}.${this.domain}${u.port ? ":" + u.port : ""}`;
    }
    return `${this.#publicUrl.origin}${this.#publicUrl.pathname.replace(/\/$/, "")}/api${PATH_PREFIX}/${id}/${port}`;
  }
}
