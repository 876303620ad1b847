import { connect } from "node:net";
import { tunnelSocketBeside } from "@sandbar/protocol/tunnel";
import { errors } from "@sandbar/protocol";
import type { AgentDial, SandboxRuntime } from "@sandbar/runner/runtime";

// The runtime contract (SandboxRuntime and its records) is the runner package's: a `sandbar
// runner` serves it and control drives it, in-process or remotely. Control adds how an agent on
// this host is dialled, and the stand-in where sandboxes cannot run.

export type { AgentDial, RuntimeHealth, RuntimeNetwork, RuntimeResources, RuntimeSandbox, RuntimeSandboxSpec, SandboxRuntime } from "@sandbar/runner/runtime";

/** The agent of this host behind its unix socket (its tunnel socket sits beside it). */
export function unixAgentDial(socket: string, secret: string): AgentDial {
  const tunnel = tunnelSocketBeside(socket);
  return { key: socket, secret, api: () => connect(socket), tunnel: () => connect({ path: tunnel, allowHalfOpen: true }) };
}

/** Stands in where sandboxes cannot run (not root, no bubblewrap): every call says why. */
export function unavailableRuntime(reason: string): SandboxRuntime {
  const fail = async (): Promise<never> => {
    throw errors.unavailable(`Sandboxes are not available on this server: ${reason}`);
  };
  return {
    runnerId: "unavailable",
    agentsOnThisHost: false,
    assertReady: fail,
    create: fail,
    start: fail,
    stop: fail,
    destroy: fail,
    pause: fail,
    resume: fail,
    setEnv: fail,
    setNetwork: fail,
    resize: fail,
    pack: fail,
    restore: fail,
    captureLayer: fail,
    squashLayers: fail,
    removeLayers: async () => {},
    listLayers: async () => [],
    list: async () => [],
    inspect: async () => undefined,
    connectAgent: fail,
    close: async () => {},
  };
}
