// Sandbox states as stored (the reference's lower-case strings) and as reported.
//
// An operation first records where it is going (desiredState), does the work, then records
// where the sandbox is (state). While the two differ the API reports the transition, derived as
// the reference derives it: stopped + desired started reads "starting", and so on.

/** The state the API reports (SandboxState's JSON spelling). */
export function reportedState(state: string, desired: string): string {
  if (state === "started" && desired === "stopped") return "stopping";
  if (state === "started" && desired === "destroyed") return "destroying";
  if (state === "stopped" && desired === "started") return "starting";
  if (state === "stopped" && desired === "destroyed") return "destroying";
  if (state === "stopped" && desired === "archived") return "archiving";
  if (state === "unknown" && desired === "started") return "creating";
  if (state === "archived" && desired === "destroyed") return "destroying";
  if (state === "started" && desired === "paused") return "pausing";
  if (state === "paused" && desired === "started") return "resuming";
  if (state === "paused" && desired === "stopped") return "stopping";
  if (state === "paused" && desired === "destroyed") return "destroying";
  return state;
}

/** The same derivation in SQL, for filters on the reported state. */
export const REPORTED_STATE_SQL = `(case
  when "state" = 'started' and "desired_state" = 'stopped' then 'stopping'
  when "state" = 'started' and "desired_state" = 'destroyed' then 'destroying'
  when "state" = 'stopped' and "desired_state" = 'started' then 'starting'
  when "state" = 'stopped' and "desired_state" = 'destroyed' then 'destroying'
  when "state" = 'stopped' and "desired_state" = 'archived' then 'archiving'
  when "state" = 'unknown' and "desired_state" = 'started' then 'creating'
  when "state" = 'archived' and "desired_state" = 'destroyed' then 'destroying'
  when "state" = 'started' and "desired_state" = 'paused' then 'pausing'
  when "state" = 'paused' and "desired_state" = 'started' then 'resuming'
  when "state" = 'paused' and "desired_state" = 'stopped' then 'stopping'
  when "state" = 'paused' and "desired_state" = 'destroyed' then 'destroying'
  else "state" end)`;

export const isErrored = (state: string) => state === "error" || state === "build_failed";

/** Ephemeral sandboxes are deleted when they stop and can be neither archived nor backed up. */
export const isEphemeral = (autoDeleteInterval: number) => autoDeleteInterval === 0;

/** The reference's MAX_AUTO_ARCHIVE_INTERVAL default: 30 days, in minutes. */
const MAX_AUTO_ARCHIVE_INTERVAL = 43200;

/** Auto-archive intervals as stored: 0 means the maximum, larger values are clamped to it. */
export function normalizeAutoArchive(minutes: number): number {
  return minutes === 0 ? MAX_AUTO_ARCHIVE_INTERVAL : Math.min(minutes, MAX_AUTO_ARCHIVE_INTERVAL);
}
