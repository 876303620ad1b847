import { errors } from "@sandbar/protocol";
import { readPasswd } from "../host/rootprep.ts";
import type { Image } from "./store.ts";

// The image's USER as the sandbox's user name: "name" and "name:group" are the name; "uid" and
// "uid:gid" are the name its /etc/passwd gives that uid (0 is root). The provider then runs the
// sandbox as that passwd entry's uid and gid (linux/rootprep.ts sandboxUser).

const NAME = /^[a-z_][a-z0-9_-]{0,31}$/;

/** Undefined when the image sets no USER; refuses one the sandbox cannot be run as. */
export async function imageUser(image: Pick<Image, "rootfs" | "config">): Promise<string | undefined> {
  const raw = image.config.user?.trim();
  if (!raw) return undefined;
  const user = raw.split(":")[0]!;
  if (/^\d+$/.test(user)) {
    if (Number(user) === 0) return "root";
    for (const [name, entry] of await readPasswd(image.rootfs)) if (entry.uid === Number(user) && NAME.test(name)) return name;
    throw errors.invalidArgument(`The image's USER ${raw} has no entry in its /etc/passwd: set user in the request`);
  }
  if (!NAME.test(user)) throw errors.invalidArgument(`The image's USER ${JSON.stringify(raw.slice(0, 64))} is not a user name this server can run as: set user in the request`);
  return user;
}
