/**
 * The entry of the agent's V8 startup snapshot (build.ts bundles it into one
 * CommonJS script and runs `node --build-snapshot` on it; see snapshot-blob.ts).
 * Run as `node --snapshot-blob <dist>/<blob> <dist>/agent.mjs <agent args>`:
 * node deserializes the heap this script left and calls runAgent, with the
 * command line of the run (process.argv has the same shape as the bundle's).
 *
 * While the snapshot is built, what every first call needs is loaded into the
 * heap: Connect, the RPC handler, the protobuf runtime with the info, file and
 * process services' descriptors and their implementations. node:http2 cannot
 * be (Node 24 aborts building a snapshot that loads it, as it does for http and
 * tls): the agent loads it after it listens, as the bundle does. The other
 * services (git, PTY, language servers, environment) stay unevaluated code in
 * the heap, loaded on their first call; node-pty is a native addon and loads
 * from the bundle's node_modules then (esbuild's `nodePtyAtRunTime` in build.ts).
 * Nothing here may read the command line, the environment or the clock at
 * module level: that would be the build machine's, frozen in the heap.
 */
import { pathToFileURL } from "node:url";
import { startupSnapshot } from "node:v8";
import { runAgent } from "./cli.ts";
import { setAgentEntryUrl } from "./util/snapshot-url.ts";

// Awaited by node before it writes the snapshot (it drains the event loop first).
void Promise.all([
  import("./rpc.ts"),
  import("@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js"),
  import("./info/service.ts"),
  import("@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js"),
  import("./files/service.ts"),
  import("@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js"),
  import("./process/service.ts"),
  import("./sessions/manager.ts"),
]);

startupSnapshot.setDeserializeMainFunction(() => {
  // process.argv[1] is the script given after the blob: agent.mjs in the bundle directory.
  setAgentEntryUrl(pathToFileURL(process.argv[1] ?? "").href);
  void runAgent();
});
