import type { DescMethod, DescService } from "@bufbuild/protobuf";
import { createContextKey, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { asConnectError, ConnectError, errors, routeOf, type Route } from "@sandbar/protocol";
import type { Guard } from "../auth/guard.ts";
import { authContextKey } from "../auth/principal.ts";

type AnyImpl = (input: unknown, ctx: HandlerContext) => unknown;

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
  const wrapped: Record<string, AnyImpl> = {};
  for (const method of service.methods) {
    const fn = (impl as Record<string, AnyImpl | undefined>)[method.localName]?.bind(impl) ?? notYet(method);
    wrapped[method.localName] = wrap(method, fn, guard, routeFor(method));
  }
  return wrapped as Partial<ServiceImpl<S>>;
}

function wrap(method: DescMethod, fn: AnyImpl, guard: Guard, route: Route): AnyImpl {
  const enter = async (input: unknown, ctx: HandlerContext) => {
    // Streaming requests are authorized on their headers alone.
    const message = method.methodKind === "unary" || method.methodKind === "server_streaming" ? input : undefined;
    ctx.values.set(authContextKey, await guard.check(method, ctx.requestHeader, message, route));
    const problems = ctx.values.get(inputProblemsKey);
    if (problems.length) throw errors.invalidArgument(problems.join(", "));
  };
  if (method.methodKind === "server_streaming" || method.methodKind === "bidi_streaming") {
    return async function* (input: unknown, ctx: HandlerContext) {
      try {
        await enter(input, ctx);
        yield* fn(input, ctx) as AsyncIterable<unknown>;
      } catch (err) {
        throw failure(method, err);
      }
    };
  }
  return async (input: unknown, ctx: HandlerContext) => {
    try {
      await enter(input, ctx);
      return await fn(input, ctx);
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
