import { readFile } from "node:fs/promises";

/** The numeric id of a user or group given by name or number, from /etc/passwd or /etc/group. */
async function lookupId(db: "/etc/passwd" | "/etc/group", nameOrId: string): Promise<number | undefined> {
  if (/^\d+$/.test(nameOrId)) return Number(nameOrId);
  let text: string;
  try {
    text = await readFile(db, "utf8");
  } catch {
    return undefined;
  }
  for (const line of text.split("\n")) {
    const fields = line.split(":");
    if (fields[0] === nameOrId && fields.length >= 3) return Number(fields[2]);
  }
  return undefined;
}

export const lookupUid = (name: string) => lookupId("/etc/passwd", name);
export const lookupGid = (name: string) => lookupId("/etc/group", name);

/** Parses an octal mode text ("755", "0755"); undefined when malformed. */
export function parseMode(mode: string): number | undefined {
  if (!/^0?[0-7]{3,4}$/.test(mode)) return undefined;
  const n = parseInt(mode, 8);
  return n <= 0o7777 ? n : undefined;
}
