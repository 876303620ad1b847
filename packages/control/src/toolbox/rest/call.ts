import {
  create,
  type DescMessage,
  type DescMethod,
  type DescMethodClientStreaming,
  type DescMethodServerStreaming,
  type DescMethodUnary,
  type MessageInitShape,
  type MessageShape,
} from "@bufbuild/protobuf";
import type { CallOptions } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import type { AgentClients } from "../agent-clients.ts";
import type { AgentEndpoint, AgentLocator } from "../agent-locator.ts";
import { type Call, contextFor } from "../../call/call.ts";
import type { CallChain } from "../../call/chain.ts";
import { stringProblems, textProblems } from "../../services/validate.ts";

/**
 * How a toolbox REST handler calls the agent's services for one request. `problems` are input
 * decoding problems: they are raised after the caller is checked (401 before 400).
 */
export interface ToolboxCaller {
  unary<I extends DescMessage, O extends DescMessage>(method: DescMethodUnary<I, O>, input: MessageInitShape<I>, problems?: string[]): Promise<MessageShape<O>>;
  serverStream<I extends DescMessage, O extends DescMessage>(method: DescMethodServerStreaming<I, O>, input: MessageInitShape<I>, problems?: string[]): AsyncIterable<MessageShape<O>>;
  clientStream<I extends DescMessage, O extends DescMessage>(method: DescMethodClientStreaming<I, O>, input: AsyncIterable<MessageInitShape<I>>): Promise<MessageShape<O>>;
}

/**
 * Invokes the agent's methods through the call chain for the request's call (the sandbox in the
 * path routes it): the chain checks the caller and the toolbox scope once per request, then the
 * forwarder locates the sandbox's agent.
 */
export function chainCaller(chain: CallChain, call: Call, signal: AbortSignal): ToolboxCaller {
  // One id that cannot be an id is reported after authentication, like any input problem.
  const idProblems = textProblems("sandbox_id", "sandboxId", call.sandboxId ?? "");
  const context = (method: DescMethod, problems: string[] = []) => contextFor(call, method, signal, [...idProblems, ...problems]);
  return {
    async unary(method, input, problems) {
      return create(method.output, (await chain.unary(context(method, problems), create(method.input, input))) as never);
    },
    async *serverStream(method, input, problems) {
      for await (const msg of chain.stream(context(method, problems), create(method.input, input))) yield create(method.output, msg as never);
    },
    async clientStream(method, input) {
      return create(method.output, (await chain.unary(context(method), input)) as never);
    },
  };
}

/**
 * Calls the agent directly, for a request authorized by the sandbox's preview token (the
 * locator checked it; there is no API key or JWT for the guard to check).
 */
export function agentCaller(clients: AgentClients, locator: AgentLocator, agent: AgentEndpoint, signal: AbortSignal): ToolboxCaller {
  const options: CallOptions = { headers: { authorization: `Bearer ${agent.secret}` }, signal };
  const call = (method: DescMethod, input: unknown, problems: string[] = []): unknown => {
    problems = [...problems, ...stringProblems(method.input, input)];
    if (problems.length) throw errors.invalidArgument(problems.join(", "));
    locator.touch(agent.sandboxId);
    const client = clients.client(method.parent, agent) as unknown as Record<string, (input: unknown, options: CallOptions) => unknown>;
    return client[method.localName](input, options);
  };
  return {
    async unary(method, input, problems) {
      return (await call(method, input, problems)) as never;
    },
    async *serverStream(method, input, problems) {
      yield* call(method, input, problems) as AsyncIterable<never>;
    },
    async clientStream(method, input) {
      return (await call(method, input)) as never;
    },
  };
}
