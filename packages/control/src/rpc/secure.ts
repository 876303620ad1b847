import type { DescMethod, DescService } from "@bufbuild/protobuf";
import { createContextKey, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { asConnectError, ConnectError, errors, routeOf, type Route } from "@sandbar/protocol";
import type { CallSite, Guard } from "../auth/guard.ts";
import { authContextKey } from "../auth/principal.ts";
import { rateFiguresKey, writeFigures } from "../limits/figures.ts";
import { clientAddressKey } from "../server/client-address.ts";
import { stringProblems } from "../services/validate.ts";

type AnyImpl = (input: unknown, ctx: HandlerContext) => unknown;

/**
 * On a secured implementation: checks a call's credentials and scope before its body is read
 * (the REST gateway reads bodies only for callers that may make the call). `partial` is the
 * request as far as the path and query give it.
 */
export const precheck = Symbol("sandbar.precheck");
export type Precheck = (method: DescMethod, header: Headers, partial: unknown, call?: CallSite) => Promise<void>;

/** Set when the REST gateway's precheck already counted the request against its rate limit. */
export const rateLimitCountedKey = createContextKey<boolean>(false);

/**
 * Problems the REST gateway found decoding a request. They are raised after the guard, so
 * a caller without credentials learns nothing about the input rules (401 before 400).
 */
export const inputProblemsKey = createContextKey<string[]>([]);

/**
 * Wraps a service implementation so that every method passes the guard first. Both the
 * Connect/gRPC router and the REST gateway call the wrapped methods: one enforcement path.
 * Methods without an implementation still pass the guard, then answer UNIMPLEMENTED.
 * Unexpected failures become INTERNAL without leaking their text.
 */
export function secure<S extends DescService>(
  service: S,
  impl: Partial<ServiceImpl<S>>,
  guard: Guard,
  routeFor: (method: DescMethod) => Route = routeOf,
): Partial<ServiceImpl<S>> {
  const wrapped: Record<string, AnyImpl> & { [precheck]?: Precheck } = {};
  for (const method of service.methods) {
    const fn = (impl as Record<string, AnyImpl | undefined>)[method.localName]?.bind(impl) ?? notYet(method);
    wrapped[method.localName] = wrap(method, fn, guard, routeFor(method));
  }
  wrapped[precheck] = async (method, header, partial, call) => void (await guard.check(method, header, partial, routeFor(method), call));
  return wrapped as Partial<ServiceImpl<S>>;
}

function wrap(method: DescMethod, fn: AnyImpl, guard: Guard, route: Route): AnyImpl {
  const enter = async (input: unknown, ctx: HandlerContext) => {
    // Streaming requests are authorized on their headers alone.
    const message = method.methodKind === "unary" || method.methodKind === "server_streaming" ? input : undefined;
    const call: CallSite = { address: ctx.values.get(clientAddressKey), counted: ctx.values.get(rateLimitCountedKey) };
    ctx.values.set(authContextKey, await guard.check(method, ctx.requestHeader, message, route, call));
    // REST writes the figures onto its response itself; RPC callers get them as response headers.
    if (call.figures) {
      if (ctx.protocolName === "rest") ctx.values.set(rateFiguresKey, call.figures);
      else writeFigures(call.figures, (k, v) => ctx.responseHeader.set(k, v));
    }
    // Decoding problems (REST), then every string of the request: the one check both protocols pass.
    const problems = [...ctx.values.get(inputProblemsKey), ...(message === undefined ? [] : stringProblems(method.input, message))];
    if (problems.length) throw errors.invalidArgument(problems.join(", "));
  };
  // Client streams: each message is checked as it is pulled (a plain iterator, not a generator:
  // uploads pass through it chunk by chunk and must not be held any longer than before).
  const checked = (input: unknown): AsyncIterable<unknown> => ({
    [Symbol.asyncIterator]() {
      const source = (input as AsyncIterable<unknown>)[Symbol.asyncIterator]();
      return {
        async next() {
          const r = await source.next();
          const problems = r.done ? [] : stringProblems(method.input, r.value);
          if (problems.length) {
            await source.return?.();
            throw errors.invalidArgument(problems.join(", "));
          }
          return r;
        },
        return: async (value?: unknown) => (await source.return?.(value)) ?? { done: true, value: undefined },
        throw: async (err?: unknown) => {
          if (source.throw) return source.throw(err);
          throw err;
        },
      };
    },
  });
  if (method.methodKind === "server_streaming" || method.methodKind === "bidi_streaming") {
    return async function* (input: unknown, ctx: HandlerContext) {
      try {
        await enter(input, ctx);
        yield* fn(method.methodKind === "bidi_streaming" ? checked(input) : input, ctx) as AsyncIterable<unknown>;
      } catch (err) {
        throw failure(method, err);
      }
    };
  }
  return async (input: unknown, ctx: HandlerContext) => {
    try {
      await enter(input, ctx);
      return await fn(method.methodKind === "client_streaming" ? checked(input) : input, ctx);
    } catch (err) {
      throw failure(method, err);
    }
  };
}

function notYet(method: DescMethod): AnyImpl {
  const fail = () => {
    throw errors.unimplemented(`${method.parent.name}.${method.name} is not implemented yet`);
  };
  return method.methodKind === "server_streaming" || method.methodKind === "bidi_streaming"
    ? async function* () {
        yield fail();
      }
    : fail;
}

function failure(method: DescMethod, err: unknown): ConnectError {
  if (!(err instanceof ConnectError)) console.error(`${method.parent.typeName}/${method.name} failed:`, err);
  return asConnectError(err);
}
