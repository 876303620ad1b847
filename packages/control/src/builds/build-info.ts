import { createHash } from "node:crypto";
import type { CreateBuildInfo } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { CONTEXT_HASH } from "../object-storage/index.ts";
import { Checks } from "../services/validate.ts";

// A declarative build as requested (buildInfo on POST /snapshots and POST /sandbox) and as
// recorded: its reference's build ref, the content address that makes identical builds one.

export interface BuildInfoRecord {
  dockerfileContent: string;
  contextHashes: string[];
  /** `daytona-<sha256 hex>:daytona`, as the reference names builds. */
  snapshotRef: string;
  createdAt: string;
  /** A snapshot's build: the region whose runners build it (the request's regionId); absent: the organization's default. */
  regionId?: string;
  /** A snapshot's build: the runner it runs (or last ran) on. */
  runnerId?: string;
}

const MAX_DOCKERFILE = 256 * 1024;
const MAX_CONTEXTS = 1000;

/** The reference's build ref: sha256 of the Dockerfile and the sorted context hashes joined. */
function buildRef(dockerfile: string, contextHashes: string[]): string {
  const hex = createHash("sha256").update(dockerfile + [...contextHashes].sort().join("")).digest("hex");
  return `daytona-${hex}:daytona`;
}

/** The sha256 hex of a build ref (a file name). */
export const refHex = (ref: string) => ref.slice("daytona-".length, "daytona-".length + 64);

/** Checks a client's buildInfo (400 naming the field) and records it. */
export function checkBuildInfo(info: CreateBuildInfo): BuildInfoRecord {
  const checks = new Checks();
  checks.that(info.dockerfileContent.trim() !== "", "buildInfo.dockerfileContent should not be empty");
  checks.that(info.dockerfileContent.length <= MAX_DOCKERFILE, `buildInfo.dockerfileContent must be shorter than or equal to ${MAX_DOCKERFILE} characters`);
  checks.that(!info.dockerfileContent.includes("\0"), "buildInfo.dockerfileContent must not contain NUL characters");
  checks.that(info.contextHashes.length <= MAX_CONTEXTS, `buildInfo.contextHashes must contain no more than ${MAX_CONTEXTS} elements`);
  for (const h of info.contextHashes) checks.that(CONTEXT_HASH.test(h), `buildInfo.contextHashes: each value must be a context hash (letters, digits, '-' or '_'), got ${JSON.stringify(h.slice(0, 40))}`);
  checks.done();
  const contextHashes = [...info.contextHashes];
  return { dockerfileContent: info.dockerfileContent, contextHashes, snapshotRef: buildRef(info.dockerfileContent, contextHashes), createdAt: new Date().toISOString() };
}
