import type { IncomingMessage, ServerResponse } from "node:http";
import type { ToolboxCaller } from "./call.ts";

/** What a toolbox REST handler gets: the request, its path parameters, and a caller for the agent's services. */
interface RestContext {
  req: IncomingMessage;
  res: ServerResponse;
  sandboxId: string;
  params: Record<string, string>;
  query: URLSearchParams;
  caller: ToolboxCaller;
}

export type RestHandler = (ctx: RestContext) => Promise<void>;

/** A toolbox route written by hand, relative to a toolbox prefix (which carries `{sandbox_id}`). */
export interface ToolboxRoute<H> {
  verb: string;
  path: string;
  handle: H;
}
