import {
  create,
  isMessage,
  type Message,
  type DescMessage,
  type DescMethod,
  type DescMethodClientStreaming,
  type DescMethodServerStreaming,
  type DescMethodUnary,
  type MessageInitShape,
  type MessageShape,
} from "@bufbuild/protobuf";
import { Code, ConnectError } from "@sandbar/protocol";
import { type Call, contextFor } from "../../call/call.ts";
import type { CallChain } from "../../call/chain.ts";
import { textProblems } from "../../services/validate.ts";

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
  // A path id that cannot be an id is reported after authentication, like any input problem.
  const idProblems = textProblems("sandbox_id", "sandboxId", call.sandboxId ?? "");
  const context = (method: DescMethod, problems: string[] = []) => contextFor(call, method, signal, [...idProblems, ...problems]);
  return {
    async unary(method, input, problems) {
      return outputOf(method, await chain.unary(context(method, problems), create(method.input, input)));
    },
    async *serverStream(method, input, problems) {
      for await (const msg of chain.stream(context(method, problems), create(method.input, input))) yield outputOf(method, msg);
    },
    async clientStream(method, input) {
      return outputOf(method, await chain.unary(context(method), input));
    },
  };
}

/** The chain's answer as the method's output type (the chain makes every answer a message of that type). */
function outputOf<O extends DescMessage>(method: { output: O }, msg: Message): MessageShape<O> {
  if (isMessage(msg, method.output)) return msg;
  throw new ConnectError(`${method.output.typeName} expected, got ${msg.$typeName}`, Code.Internal);
}
