import { create, type DescMessage, type DescMethod, type DescService, type Message } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { Code, ConnectError, errors, RateLimit, routeOf, type Route } from "@sandbar/protocol";
import { RouteSchema } from "@sandbar/protocol/gen/sandbar/options/v1/options_pb.js";
import type { CallRecorder, CompleteCall } from "../audit/recorder.ts";
import type { Guard } from "../auth/guard.ts";
import type { AuthContext } from "../auth/principal.ts";
import { writeFigures } from "../limits/figures.ts";
import { requiredProblems, stringProblems } from "../services/validate.ts";
import { type Call, callKey, type CallSource, inputProblemsKey, newCall } from "./call.ts";
import { reportUnexpected } from "./unexpected.ts";

/** An implementation method as the chain holds it (Connect's handler signature, messages untyped). */
type Impl = (input: unknown, ctx: HandlerContext) => unknown;

/** What the rule of a method is: the contract's option, or the policy of the service it was mounted with. */
type Policy = (method: DescMethod) => Route;

interface Mounted {
  route: Route;
  /** The implementation wrapped in the chain. */
  run: Impl;
}

/**
 * The one owner of every call. Services are mounted here; every entry point (the Connect router,
 * the REST gateway and its hand-written routes, WebSockets, the gRPC fast path, the preview proxy;
 * the S3 endpoint and the registry's token service through `foreignAdmission`) makes a Call and
 * invokes methods through the chain, which runs, in order:
 *
 *   authenticate -> rate limit (once per request: `admit`) -> audit (the entry is written before
 *   anything else runs, completed with the outcome) -> input checks -> implementation
 *
 * Unexpected failures become INTERNAL without leaking their text. A method without an
 * implementation still passes authentication, then answers UNIMPLEMENTED.
 */
export class CallChain {
  readonly #guard: Guard;
  readonly #recorder?: CallRecorder;
  readonly #methods = new Map<DescMethod, Mounted>();

  constructor(guard: Guard, recorder?: CallRecorder) {
    this.#guard = guard;
    this.#recorder = recorder;
  }

  /** Serves `service` through the chain; `policy` overrides the contract's rule (the toolbox's own). */
  mount<S extends DescService>(service: S, impl: Partial<ServiceImpl<S>>, policy: Policy = routeOf): void {
    for (const method of service.methods) {
      const own: unknown = Reflect.get(impl, method.localName);
      const fn = typeof own === "function" ? (input: unknown, ctx: HandlerContext): unknown => Reflect.apply(own, impl, [input, ctx]) : notYet(method);
      const route = policy(method);
      this.#methods.set(method, { route, run: this.#wrap(method, fn, route, route.audit?.action ? this.#recorder : undefined) });
    }
  }

  /** Whether the service is mounted. */
  serves(service: DescService): boolean {
    return service.methods.every((m) => this.#methods.has(m));
  }

  /** The service as Connect's router serves it: each method reads its Call from the context the adapter made. */
  implementation<S extends DescService>(service: S): Partial<ServiceImpl<S>> {
    const out: Record<string, Impl> = {};
    for (const method of service.methods) out[method.localName] = this.#mounted(method).run;
    return out as Partial<ServiceImpl<S>>;
  }

  /**
   * Authenticates the call and counts it against its rate limit, before an adapter reads a body
   * (401/403/429 before 413 or 400). `partial` is the request as far as the path and query give it
   * (the organization it names). Done once per request: later invocations find the call admitted.
   */
  async admit(call: Call, method: DescMethod, partial?: unknown): Promise<AuthContext> {
    return this.#admit(call, method, this.#mounted(method).route, partial);
  }

  /**
   * Admits a call its adapter authenticated with a credential the guard does not take (a
   * sandbox's preview token, which opens that sandbox's toolbox WebSockets): as `auth`, for the
   * rule `method` is mounted under. The rest of the chain runs as for any call.
   */
  grant(call: Call, method: DescMethod, auth: AuthContext): void {
    call.admission = { route: this.#mounted(method).route, auth };
  }

  /**
   * Admits a call of a protocol whose credentials the guard does not know (the S3 endpoint's SigV4
   * push keys, the internal registry's basic auth): the adapter's `verify` checks them and names the
   * organization (UNAUTHENTICATED when wrong); the chain throttles failed attempts by the client's
   * address and counts the call under `route`, as for every other way in.
   */
  async admitForeign(call: Call, route: Route, verify: () => Promise<AuthContext>): Promise<AuthContext> {
    const auth = await this.#guard.checkForeign(route, call, verify);
    call.admission = { route, auth };
    return auth;
  }

  /**
   * `admitForeign` for a credential a route of the contract checks itself (a signed file URL):
   * counted and recorded under the rule `method` is mounted with, so its invocation finds it admitted.
   */
  admitForeignAs(call: Call, method: DescMethod, verify: () => Promise<AuthContext>): Promise<AuthContext> {
    return this.admitForeign(call, this.#mounted(method).route, verify);
  }

  /**
   * The admission of data-plane protocols with their own credentials: not rate-limited (their
   * traffic is work, as the toolbox's), failed authentications throttled by address.
   */
  foreignAdmission(): ForeignAdmission {
    const route = create(RouteSchema, { rateLimit: RateLimit.NONE });
    return (req, verify) => this.admitForeign(newCall(req), route, verify);
  }

  /** Invokes a unary or client-streaming method in a context made by `contextFor()`; answers its output message. */
  async unary(ctx: HandlerContext, input: unknown): Promise<Message> {
    return asMessage(ctx.method.output, await this.#mounted(ctx.method).run(input, ctx));
  }

  /** Invokes a server- or bidi-streaming method in a context made by `contextFor()`; yields its output messages. */
  async *stream(ctx: HandlerContext, input: unknown): AsyncIterable<Message> {
    for await (const out of this.#mounted(ctx.method).run(input, ctx) as AsyncIterable<unknown>) yield asMessage(ctx.method.output, out);
  }

  #mounted(method: DescMethod): Mounted {
    const mounted = this.#methods.get(method);
    if (!mounted) throw errors.unimplemented(`${method.parent.name}.${method.name} is not available`);
    return mounted;
  }

  async #admit(call: Call, method: DescMethod, route: Route, message: unknown): Promise<AuthContext> {
    const admitted = call.admission;
    // A request that invokes several methods is authorized again only for a method under another rule.
    if (admitted && sameRule(admitted.route, route)) return admitted.auth;
    const auth = await this.#guard.check(method, call.header, message, route, call);
    call.admission = { route, auth };
    return auth;
  }

  #wrap(method: DescMethod, fn: Impl, route: Route, recorder: CallRecorder | undefined): Impl {
    const enter = async (input: unknown, ctx: HandlerContext): Promise<CompleteCall | undefined> => {
      const call = ctx.values.get(callKey);
      if (!call) throw new ConnectError(`${method.name} was invoked without a call`, Code.Internal);
      // Streaming requests are authorized on their headers alone.
      const message = method.methodKind === "unary" || method.methodKind === "server_streaming" ? input : undefined;
      const counted = call.counted;
      await this.#admit(call, method, route, message);
      // RPC callers get the figures as response headers; REST adapters write them onto their response.
      if (!counted && call.figures && ctx.protocolName !== "rest") writeFigures(call.figures, (k, v) => ctx.responseHeader.set(k, v));
      const complete = recorder ? await recorder.begin(method, route, message, ctx) : undefined;
      try {
        const problems = [...ctx.values.get(inputProblemsKey), ...(message === undefined ? [] : [...requiredProblems(method, message), ...stringProblems(method.input, message)])];
        if (problems.length) throw errors.invalidArgument(problems.join(", "));
      } catch (err) {
        const e = failure(method, err);
        await complete?.({ error: e });
        throw e;
      }
      return complete;
    };
    if (method.methodKind === "server_streaming" || method.methodKind === "bidi_streaming") {
      return async function* (input: unknown, ctx: HandlerContext) {
        let complete: CompleteCall | undefined;
        try {
          complete = await enter(input, ctx);
          yield* fn(method.methodKind === "bidi_streaming" ? checked(method, input) : input, ctx) as AsyncIterable<unknown>;
          await complete?.({});
        } catch (err) {
          const e = failure(method, err);
          await complete?.({ error: e });
          throw e;
        } finally {
          // The caller went away mid-stream: the call was cancelled.
          await complete?.({ error: new ConnectError("The client closed the stream", Code.Canceled) });
        }
      };
    }
    return async (input: unknown, ctx: HandlerContext) => {
      let complete: CompleteCall | undefined;
      try {
        complete = await enter(input, ctx);
        const result = await fn(method.methodKind === "client_streaming" ? checked(method, input) : input, ctx);
        await complete?.({ result });
        return result;
      } catch (err) {
        const e = failure(method, err);
        await complete?.({ error: e });
        throw e;
      }
    };
  }
}

/** How an adapter of a protocol with credentials of its own enters the chain (CallChain.foreignAdmission). */
export type ForeignAdmission = (req: CallSource, verify: () => Promise<AuthContext>) => Promise<AuthContext>;

/** Two rules that admit the same callers (the toolbox mounts every agent method under one). */
const sameRule = (a: Route, b: Route) => a === b || (a.auth === b.auth && a.scope === b.scope && a.owner === b.owner && a.userLevel === b.userLevel && a.rateLimit === b.rateLimit);

/**
 * Client streams: each message's strings are checked as it is pulled (a plain iterator, not a
 * generator: uploads pass through it chunk by chunk and must not be held any longer than before).
 */
function checked(method: DescMethod, input: unknown): AsyncIterable<unknown> {
  return {
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
  };
}

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null;

/** An implementation's answer as its output message (one already is: create() returns it as it is). */
function asMessage(desc: DescMessage, value: unknown): Message {
  return create(desc, isRecord(value) ? value : undefined);
}

function notYet(method: DescMethod): Impl {
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
