#!/usr/bin/env node
/** The agent's entry point (see cli.ts for its command line). */
import { runAgent } from "./cli.ts";

await runAgent();
