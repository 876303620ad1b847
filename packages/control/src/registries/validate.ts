import { Checks } from "../services/validate.ts";
import { parseRegistryUrl, type RegistryUrl } from "./url.ts";

// The input rules of create and update, in the reference's class-validator words where it has
// them ("url must be a URL address", "<field> should not be empty").

/** Repository path components (the distribution spec's rule): a Harbor project or a namespace. */
const PROJECT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/;

export interface RegistryInput {
  name: string;
  url: string;
  username: string;
  password?: string;
  project?: string;
}

export interface CheckedRegistry {
  name: string;
  url: RegistryUrl;
  username: string;
  password?: string;
  project?: string;
}

/** The input trimmed and checked; every problem is reported at once as one 400. */
export function checkRegistryInput(req: RegistryInput, passwordRequired: boolean): CheckedRegistry {
  const checks = new Checks().displayName("name", req.name);
  const url = parseRegistryUrl(req.url);
  checks.that(url !== undefined, "url must be a URL address");
  const username = req.username.trim();
  checks.that(username !== "", "username should not be empty");
  // Basic auth joins user and password with ':'; a control character would break the auth file.
  checks.that(!username.includes(":"), "username must not contain ':'");
  checks.that(!/[\u0000-\u001f\u007f]/.test(username), "username must not contain control characters");
  if (passwordRequired || req.password !== undefined) checks.that((req.password ?? "") !== "", "password should not be empty");
  const project = req.project?.trim();
  if (project) {
    checks.that(project.length <= 255, "project must be shorter than or equal to 255 characters");
    checks.that(PROJECT.test(project), "project must be lowercase letters and digits, separated by '.', '_' or '-', with single slashes between components");
  }
  checks.done();
  const out: CheckedRegistry = { name: req.name.trim(), url: url!, username };
  if (req.password !== undefined) out.password = req.password;
  if (project !== undefined) out.project = project;
  return out;
}
