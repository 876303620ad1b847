import type { ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import type { AuditService } from "@sandbar/protocol/gen/sandbar/control/v1/audit_pb.js";
import { organizationOf } from "../call/call.ts";
import { listAuditLogs } from "./list.ts";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** The audit log's two lists: an organization's (read:audit_logs, checked by the guard) and the operator's. */
export function auditService(orm: MikroORM): Partial<ServiceImpl<typeof AuditService>> {
  return {
    // The guard resolved the organization from the path: another organization's is a 404 there.
    listAuditLogs: (req, ctx) => listAuditLogs(orm, organizationOf(ctx), req),
    listAllAuditLogs: (req) => {
      if (req.organizationId !== undefined && !UUID.test(req.organizationId)) throw errors.invalidArgument("organizationId must be a UUID");
      return listAuditLogs(orm, req.organizationId, req);
    },
  };
}
