import type { ServiceImpl } from "@connectrpc/connect";
import { type Health, HealthCheckResponse_ServingStatus as Status } from "@sandbar/protocol/gen/grpc/health/v1/health_pb.js";
import { errors } from "@sandbar/protocol";

/** grpc.health.v1: the server, and each service it hosts, is SERVING while it runs. */
export function healthService(known: Set<string>, ready: () => Promise<boolean>): ServiceImpl<typeof Health> {
  const status = async (service: string) => {
    if (service !== "" && !known.has(service)) throw errors.notFound(`unknown service ${service}`);
    return (await ready()) ? Status.SERVING : Status.NOT_SERVING;
  };
  return {
    async check(req) {
      return { status: await status(req.service) };
    },
    async *watch(req, ctx) {
      yield { status: await status(req.service) };
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
    },
    async list() {
      const statuses: Record<string, { status: Status }> = {};
      for (const s of known) statuses[s] = { status: Status.SERVING };
      return { statuses };
    },
  };
}
