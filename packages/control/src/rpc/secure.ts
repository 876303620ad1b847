import type { DescMethod, DescService } from "@bufbuild/protobuf";
import { createContextKey, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { Code, ConnectError, errors, routeOf, type Route } from "@sandbar/protocol";
import type { CallRecorder, CompleteCall } from "../audit/recorder.ts";
import type { CallSite, Guard } from "../auth/guard.ts";
import { authContextKey, type Principal } from "../auth/principal.ts";
import { rateFiguresKey, writeFigures } from "../limits/figures.ts";
import { clientAddressKey } from "../server/client-address.ts";
import { requiredProblems, stringProblems } from "../services/validate.ts";
import { reportUnexpected } from "./unexpected.ts";

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

/** Who the REST gateway's precheck authenticated for this request (not authenticated again). */
export const precheckedPrincipalKey = createContextKey<Principal | undefined>(undefined);

/**
 * Problems the REST gateway found decoding a request. They are raised after the guard, so
 * a caller without credentials learns nothing about the input rules (401 before 400).
 */
export const inputProblemsKey = createContextKey<string[]>([]);

/**
 * Wraps a service implementation so that every method passes the guard first. Both the
 * Connect/gRPC router and the REST gateway call the wrapped methods: one enforcement path.
 * Methods without an implementation still pass the guard, then answer UNIMPLEMENTED.
 * Unexpected failures become INTERNAL without leaking their text. With a recorder, every method
 * whose route declares an `audit` (the state-changing ones) is recorded once the guard let it in.
 */
export function secure<S extends DescService>(
  service: S,
  impl: Partial<ServiceImpl<S>>,
  guard: Guard,
  routeFor: (method: DescMethod) => Route = routeOf,
  recorder?: CallRecorder,
): Partial<ServiceImpl<S>> {
  const wrapped: Record<string, AnyImpl> & { [precheck]?: Precheck } = {};
  for (const method of service.methods) {
    const fn = (impl as Record<string, AnyImpl | undefined>)[method.localName]?.bind(impl) ?? notYet(method);
    const route = routeFor(method);
    wrapped[method.localName] = wrap(method, fn, guard, route, route.audit?.action ? recorder : undefined);
  }
  wrapped[precheck] = async (method, header, partial, call) => void (await guard.check(method, header, partial, routeFor(method), call));
  return wrapped as Partial<ServiceImpl<S>>;
}

/** A call's audit entry, once written: completed exactly once with the outcome. */
interface Call {
  complete?: CompleteCall;
}

function wrap(method: DescMethod, fn: AnyImpl, guard: Guard, route: Route, recorder: CallRecorder | undefined): AnyImpl {
  const enter = async (input: unknown, ctx: HandlerContext, call: Call) => {
    // Streaming requests are authorized on their headers alone.
    const message = method.methodKind === "unary" || method.methodKind === "server_streaming" ? input : undefined;
    const site: CallSite = { address: ctx.values.get(clientAddressKey), counted: ctx.values.get(rateLimitCountedKey), principal: ctx.values.get(precheckedPrincipalKey) };
    ctx.values.set(authContextKey, await guard.check(method, ctx.requestHeader, message, route, site));
    // REST writes the figures onto its response itself; RPC callers get them as response headers.
    if (site.figures) {
      if (ctx.protocolName === "rest") ctx.values.set(rateFiguresKey, site.figures);
      else writeFigures(site.figures, (k, v) => ctx.responseHeader.set(k, v));
    }
    // The entry is written before anything else runs (input refused as 400 is recorded too).
    if (recorder) call.complete = await recorder.begin(method, route, message, ctx);
    // Decoding problems (REST), then every string of the request: the one check both protocols pass.
    const problems = [...ctx.values.get(inputProblemsKey), ...(message === undefined ? [] : [...requiredProblems(method, message), ...stringProblems(method.input, message)])];
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
      const call: Call = {};
      try {
        await enter(input, ctx, call);
        yield* fn(method.methodKind === "bidi_streaming" ? checked(input) : input, ctx) as AsyncIterable<unknown>;
        await call.complete?.({});
      } catch (err) {
        const e = failure(method, err);
        await call.complete?.({ error: e });
        throw e;
      } finally {
        // The caller went away mid-stream: the call was cancelled.
        await call.complete?.({ error: new ConnectError("The client closed the stream", Code.Canceled) });
      }
    };
  }
  return async (input: unknown, ctx: HandlerContext) => {
    const call: Call = {};
    try {
      await enter(input, ctx, call);
      const result = await fn(method.methodKind === "client_streaming" ? checked(input) : input, ctx);
      await call.complete?.({ result });
      return result;
    } catch (err) {
      const e = failure(method, err);
      await call.complete?.({ error: e });
      throw e;
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
  return reportUnexpected(`${method.parent.typeName}/${method.name}`, err);
}
