/**
 * import.meta.url in the snapshot build (build.ts defines it as agentEntryUrl):
 * a snapshot is one CommonJS script with no module URL, and the path it was
 * built at is not where sandboxes run it. snapshot.ts sets it when the agent
 * starts, to agent.mjs where this run sees the bundle (the script node was
 * given); what resolves from import.meta.url (node-pty, the language server)
 * then resolves from the bundle's node_modules as it does in the bundle.
 */
// Until then a placeholder that parses: bundled libraries resolve URLs from it at module level
// (@sandbar/protocol's generated-code root, which the agent never reads).
export let agentEntryUrl = "file:///opt/sandbar/agent/agent.mjs";

export function setAgentEntryUrl(url: string): void {
  agentEntryUrl = url;
}
