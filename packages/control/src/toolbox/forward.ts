import { type DescMethod, type DescMethodUnary, type DescService, isMessage } from "@bufbuild/protobuf";
import { ConnectError, type CallOptions, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import { callKey, organizationOf, SANDBOX_ID_HEADER } from "../call/call.ts";
import { HTTP_STATUS_META } from "../gateway/http-io.ts";
import type { AgentClients } from "./agent-clients.ts";
import type { AgentEndpoint, AgentLocator } from "./agent-locator.ts";
import { agentUnary } from "../grpc-wire/index.ts";

type Forwarder = (input: unknown, ctx: HandlerContext) => unknown;

/**
 * An implementation of an agent service that forwards every call to the agent of the sandbox
 * the call names, after the guard has checked the caller: the toolbox messages are defined once,
 * by the agent's own contract, and streams pass through as streams.
 */
export function forwardingImpl<S extends DescService>(service: S, locator: AgentLocator, clients: AgentClients): Partial<ServiceImpl<S>> {
  const impl: Record<string, Forwarder> = {};
  for (const method of service.methods) impl[method.localName] = forwarder(service, method, locator, clients);
  return impl as Partial<ServiceImpl<S>>;
}

function forwarder(service: DescService, method: DescMethod, locator: AgentLocator, clients: AgentClients): Forwarder {
  const target = async (ctx: HandlerContext) => {
    const agent = await locate(ctx, locator);
    const client = clients.client(service, agent);
    // The agent's contract defines every method the toolbox mounts (forwardingImpl reads them from it).
    const fn: unknown = Reflect.get(client, method.localName);
    if (typeof fn !== "function") throw errors.unimplemented(`${method.parent.name}.${method.name} is not available`);
    const options: CallOptions = {
      headers: { authorization: `Bearer ${agent.secret}` },
      signal: ctx.signal,
      timeoutMs: ctx.timeoutMs(),
      onHeader: (h) => h.forEach((v, k) => (k.startsWith("x-sandbar-") ? ctx.responseHeader.set(k, v) : undefined)),
    };
    return (input: unknown): unknown => Reflect.apply(fn, client, [boundTimeouts(method, input), options]);
  };
  if (method.methodKind === "server_streaming" || method.methodKind === "bidi_streaming") {
    return async function* (input: unknown, ctx: HandlerContext) {
      try {
        yield* (await target(ctx))(input) as AsyncIterable<unknown>;
      } catch (err) {
        throw relayed(err);
      }
    };
  }
  if (method.methodKind === "unary") {
    // Unary calls (exec among them) skip Connect's client: one HTTP/2 stream on the same session.
    const unary = method as DescMethodUnary;
    return async (input: unknown, ctx: HandlerContext) => {
      const agent = await locate(ctx, locator);
      const message = boundTimeouts(method, input);
      if (!isMessage(message, unary.input)) throw errors.invalidArgument(`${unary.input.typeName} expected`);
      return agentUnary(clients.session(agent), unary, message, {
        headers: { authorization: `Bearer ${agent.secret}` },
        signal: ctx.signal,
        timeoutMs: ctx.timeoutMs(),
        onHeader: (h) => {
          for (const k in h) if (k.startsWith("x-sandbar-")) ctx.responseHeader.set(k, String(h[k]));
        },
      }).catch((err: unknown) => {
        throw relayed(err);
      });
    };
  }
  return async (input: unknown, ctx: HandlerContext) => {
    try {
      return await (await target(ctx))(input);
    } catch (err) {
      throw relayed(err);
    }
  };
}

/**
 * The agent's error as this server's own, keeping the HTTP status the agent asked REST to answer
 * (a full disk: RESOURCE_EXHAUSTED, 400). Connect relays none of an error's metadata once it came
 * off the wire (the agent's headers are not the caller's), so gRPC callers would lose it.
 */
function relayed(err: unknown): unknown {
  if (!(err instanceof ConnectError) || !err.isWireError) return err;
  const status = err.metadata.get(HTTP_STATUS_META);
  if (status === null) return err;
  const own = new ConnectError(err.rawMessage, err.code, { [HTTP_STATUS_META]: status }, undefined, err.cause);
  own.details.push(...err.details);
  return own;
}

/** The sandbox's agent (the call's: REST's path, an RPC's metadata); counts as activity. */
async function locate(ctx: HandlerContext, locator: AgentLocator): Promise<AgentEndpoint> {
  const idOrName = ctx.values.get(callKey)?.sandboxId;
  if (!idOrName) throw errors.invalidArgument(`the sandbox is missing: send its id in the ${SANDBOX_ID_HEADER} header`);
  const agent = await locator.agentFor(organizationOf(ctx), idOrName);
  locator.touch(agent.sandboxId);
  return agent;
}

/**
 * The longest timeout, in seconds, an agent timer can hold (setTimeout's 2^31-1 ms); a larger one
 * would fire at once. The reference daemon (Go durations) has no such bound, so a larger value is
 * clamped to it (24.8 days: "no limit" in practice) rather than refused.
 */
const MAX_TIMEOUT_SECONDS = Math.floor((2 ** 31 - 1) / 1000);

function boundTimeouts(method: DescMethod, input: unknown): unknown {
  const msg = input as Record<string, unknown> | undefined;
  if (!msg || typeof msg !== "object" || !method.input.fields.some((f) => f.name === "timeout")) return input;
  const t = msg.timeout;
  if (typeof t === "number" && t > MAX_TIMEOUT_SECONDS) msg.timeout = MAX_TIMEOUT_SECONDS;
  return input;
}
