/** The agent's version, reported by InfoService.GetVersion. */
export const AGENT_VERSION = "0.1.0";
