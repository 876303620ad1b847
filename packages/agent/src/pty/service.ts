import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { PtyEventSchema, PtyService } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import type { PtyManager, PtySession } from "./manager.ts";

function info(s: PtySession) {
  return {
    id: s.id,
    cwd: s.cwd,
    envs: s.envs,
    cols: s.cols,
    rows: s.rows,
    createdAt: timestampFromDate(s.createdAt),
    active: s.active,
    lazyStart: s.lazyStart,
  };
}

export function createPtyService(ptys: PtyManager): ServiceImpl<typeof PtyService> {
  return {
    async createPty(req) {
      const s = await ptys.create({ id: req.id, cwd: req.cwd, envs: req.envs, cols: req.cols, rows: req.rows, lazyStart: req.lazyStart });
      return { sessionId: s.id };
    },
    listPty() {
      return { sessions: ptys.list().map(info) };
    },
    getPty(req) {
      return info(ptys.get(req.sessionId));
    },
    deletePty(req) {
      ptys.delete(req.sessionId);
      return {};
    },
    resizePty(req) {
      return info(ptys.resize(req.sessionId, req.cols, req.rows));
    },
    sendPtyInput(req) {
      ptys.get(req.sessionId).write(req.data);
      return {};
    },
    async *connectPty(req, call): AsyncGenerator<MessageInitShape<typeof PtyEventSchema>> {
      for await (const ev of ptys.get(req.sessionId).connect(call.signal)) {
        if (ev.case === "connected") yield { event: { case: "connected", value: {} } };
        else if (ev.case === "data") yield { event: { case: "data", value: ev.value } };
        else yield { event: { case: "exit", value: { exitCode: ev.exitCode, exitReason: ev.exitReason } } };
      }
    },
  };
}
