import type { RegistryCredentials } from "@sandbar/runner/images";
import type { Exec } from "../db/exec.ts";
import type { SandboxRuntime } from "./runtime.ts";

// What the sandbox operations ask of the registered runners (runners/directory.ts implements it)
// and of the snapshots (where a runner pulls an image from). Types only: placement.ts acts on them.

export type ImageSource = (organizationId: string, digest: string) => Promise<{ name: string; credentials?: RegistryCredentials }>;

/** Where sandboxes go besides this server's own runtime. */
export interface RunnerDirectory {
  /** A registered runner's runtime by the id its sandboxes record; undefined when no runner has that id. */
  runtime(runnerId: string): Promise<SandboxRuntime | undefined>;
  /** Whether the region's sandboxes go to registered runners (it has some) rather than this server's runtime. */
  servesRegion(regionId: string): Promise<boolean>;
  /** Picks a runner of the region inside the caller's transaction; undefined when the region has none registered. */
  place(exec: Exec, regionId: string, need: PlacementNeed): Promise<Placement | undefined>;
  /** A runner of the region to run a declarative build (as placement picks, without reserving). */
  builder?(regionId: string, need: { cpu: number; memory: number; disk: number }): Promise<string>;
  /** Records that a runner now holds an image (placement prefers it for sandboxes of that image). */
  holds?(runnerId: string, digest: string): Promise<void>;
  /** Removes an image no sandbox uses any more from every runner holding it. */
  dropImage?(digest: string, log?: (line: string) => void): Promise<void>;
  /** Ids (as sandboxes record them) of the runners that stopped answering: their sandboxes read as `unknown`. */
  unresponsive(): Promise<ReadonlySet<string>>;
  /** Ids (as sandboxes record them) of the runners that answer now. */
  ready(): Promise<string[]>;
}

/** What a sandbox needs of its runner. */
export interface PlacementNeed {
  cpu: number;
  memory: number;
  disk: number;
  gpu: number;
  sandboxClass: string;
  /** GPU models in order of preference; empty or absent: any. */
  gpuTypes?: readonly string[];
  imageRef?: string | null;
  volumes?: readonly unknown[] | null;
}

/** The runner placement chose, and the model of GPU the sandbox gets there (null without GPU). */
export interface Placement {
  runnerId: string;
  gpuType: string | null;
}
