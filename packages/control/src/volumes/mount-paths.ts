import { Checks } from "../services/validate.ts";

// Where a volume may be mounted inside a sandbox, by the reference's rules and words (errors
// joined by ", "), plus the runner's own directories and duplicates.

const SYSTEM_DIRS = ["/proc", "/sys", "/dev", "/boot", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/usr", "/opt/sandbar", "/run/sandbar"];

export interface RequestedMount {
  mountPath: string;
  subpath?: string;
}

/** Field problems of every requested mount, together. */
export function checkMounts(mounts: RequestedMount[], checks = new Checks()): Checks {
  const seen = new Set<string>();
  for (const { mountPath: p, subpath } of mounts) {
    if (!p.startsWith("/")) checks.that(false, `Invalid mount path ${p} (must be absolute)`);
    else if (p === "/") checks.that(false, `Invalid mount path ${p} (cannot mount to the root directory)`);
    else if (/(^|\/)\.\.?(\/|$)/.test(p) || p.includes("//")) checks.that(false, `Invalid mount path ${p} (must not contain '/./', '/../' or '//')`);
    else if (SYSTEM_DIRS.some((d) => p === d || p.startsWith(d + "/") || p === d + "/")) checks.that(false, `Invalid mount path ${p} (cannot mount to system directory)`);
    const normal = p.replace(/\/+$/, "");
    for (const other of seen) {
      if (normal === other || normal.startsWith(other + "/") || other.startsWith(normal + "/")) checks.that(false, `Invalid mount path ${p} (overlaps another volume's mount path ${other})`);
    }
    seen.add(normal);
    if (subpath !== undefined && subpath !== "") {
      checks.that(!subpath.startsWith("/") && !subpath.split("/").includes("..") && !subpath.includes("//"), `Invalid subpath ${subpath} (must be relative, without '..' or '//')`);
    }
  }
  return checks;
}
