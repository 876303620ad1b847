import { enumValueJson } from "@sandbar/protocol";
import { type Permission, PermissionSchema } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";

/** Scope strings ("write:sandboxes") and the contract's Permission values, both ways. */
export const scopeOf = (p: Permission): string => enumValueJson(PermissionSchema.value[p]);
export const permissionOf = new Map(PermissionSchema.values.filter((v) => v.number !== 0).map((v) => [enumValueJson(v), v.number as Permission]));
export const ALL_SCOPES: readonly string[] = [...permissionOf.keys()];
