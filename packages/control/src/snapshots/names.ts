import { Checks } from "../services/validate.ts";

// Snapshot names, as the reference checks them: an image reference's characters.

const NAME = /^[a-zA-Z0-9_.\-:]+(\/[a-zA-Z0-9_.\-:]+)*(@sha256:[a-f0-9]{64})?$/;

/** The name's checks, added to `checks` (a create body reports its field problems together). */
export function checkSnapshotName(checks: Checks, name: string): Checks {
  checks.displayName("name", name);
  if (name.trim() !== "") checks.that(NAME.test(name), "Invalid snapshot name format. May contain letters, digits, dots, colons, and dashes");
  return checks;
}
