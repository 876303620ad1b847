import type { SandboxRecord } from "../db/entities.ts";
import { driveArchive, driveDestroy, softDelete } from "./archive-delete.ts";
import { driveCreate } from "./create.ts";
import { sweepLayers } from "./layer-capture.ts";
import type { OperationContext } from "./operation-context.ts";
import { HeldElsewhere } from "./operation-locks.ts";
import { driveResize } from "./reconfigure.ts";
import type { SandboxRuntime } from "./runtime.ts";
import { drivePause, driveResume } from "./pause-resume.ts";
import { driveRestore, driveStart, driveStop } from "./start-stop.ts";

// At start, after a clean stop or a crash (kill -9): the database says what each sandbox should
// be, the host says what is there. Sandboxes running and started in the database are adopted;
// operations a crash interrupted are finished (create, start, restore, stop, archive, delete, resize);
// sandboxes the database wants started but whose process is gone are started again, or marked
// `error` with the reason; sandboxes on the host the database does not know (or knows as
// destroyed) are destroyed. Nothing leaks either way.

export interface ReconcileReport {
  adopted: string[];
  /** Started again, or their interrupted operation finished. */
  resumed: string[];
  /** Could not be brought back: now `error` with the reason. */
  failed: string[];
  /** On the host but unknown (or destroyed) in the database: removed. */
  removed: string[];
}

const PARALLEL = 4;

/** Whose sandboxes: this server's runtime (the default), or a registered runner's (by the id its sandboxes record). */
export interface ReconcileTarget {
  runtime: SandboxRuntime;
  runnerId: string;
}

export async function reconcile(m: OperationContext, log: (line: string) => void = () => undefined, target?: ReconcileTarget): Promise<ReconcileReport> {
  const report: ReconcileReport = { adopted: [], resumed: [], failed: [], removed: [] };
  // This server's runtime also answers for the rows no runner holds (and its partial packs).
  const home = target === undefined;
  const { runtime, runnerId } = target ?? { runtime: m.runtime, runnerId: m.runtime.runnerId };
  if (home) await m.files.removePartials();
  const host = new Map((await runtime.list()).map((s) => [s.id, s]));
  const rows = (await m.store.ofRunner(runnerId)).filter((r) => home || r.runnerId === runnerId);

  const tasks = rows.map((row) => async () => {
    if (row.backupState === "InProgress" || row.backupState === "Pending") {
      await m.store.update(row.id, { backupState: "Error" }); // its writer died with the last process
    }
    const op = m.locks.tryRun(row.id, () => resume(m, row, host.get(row.id)?.state));
    if (!op) return;
    try {
      const result = await op;
      report[result].push(row.id);
    } catch (err) {
      if (err instanceof HeldElsewhere) return; // another control process is working on it
      log(`reconcile: sandbox ${row.id}: ${String(err)}`);
      report.failed.push(row.id);
    }
  });
  await inParallel(tasks, PARALLEL);

  // What the host holds now that no live row claims.
  const held = (await runtime.list()).map((s) => s.id);
  const known = new Map((await m.store.byIds(held)).map((r) => [r.id, r]));
  const unclaimed: string[] = [];
  for (const id of held) {
    const row = known.get(id);
    const claimed = row && row.state !== "destroyed" && (row.runnerId === runnerId || (home && row.runnerId === null));
    if (claimed && row.state !== "archived") continue;
    if (row?.state === "archived" && !(await m.files.exists(m.files.archive(id)))) {
      log(`reconcile: sandbox ${id} is archived but its archive is missing; its files on this host are kept`);
      continue;
    }
    if (m.locks.busy(id)) continue;
    unclaimed.push(id);
  }
  if (runtime.removeLeftovers) {
    // The host removes them with the rest of what earlier runs left, and says what by kind.
    report.removed.push(...(await runtime.removeLeftovers(unclaimed)));
  } else {
    for (const id of unclaimed) {
      try {
        await runtime.destroy(id);
        report.removed.push(id);
      } catch (err) {
        log(`reconcile: removing sandbox ${id} from the host failed: ${String(err)}`);
      }
    }
  }
  if (home) {
    const dropped = await m.store.dropUnfinishedLayerSnapshots();
    if (dropped > 0) log(`reconcile: ${dropped} snapshot(s) of running sandboxes cut short by a restart removed`);
  }
  // Captured layers nothing names any more (a capture cut short, a delete's sweep that failed).
  await sweepLayers(m, runtime).catch((err: unknown) => log(`reconcile: sweeping layers: ${String(err)}`));
  const total = report.adopted.length + report.resumed.length + report.failed.length + report.removed.length;
  if (total > 0) {
    log(`reconcile: ${report.adopted.length} adopted, ${report.resumed.length} resumed, ${report.failed.length} in error, ${report.removed.length} removed from the host`);
  }
  return report;
}

type Result = "adopted" | "resumed" | "failed";

/** Brings one sandbox to where the database says it is going. Runs under the sandbox's lock. */
export async function resume(m: OperationContext, row: SandboxRecord, onHost: string | undefined): Promise<Result> {
  const done = (o: { failed?: string }): Result => (o.failed === undefined ? "resumed" : "failed");
  if (row.state === "snapshotting" || row.state === "forking") {
    // A capture cut short: the sandbox goes back to where it was (its runner thawed it at its open).
    row = (await m.store.update(row.id, { state: row.desiredState === "started" ? "started" : "stopped" })) ?? row;
  }
  if (row.state === "unknown" && row.parentId && row.layers?.length) {
    // A fork whose parent's capture may not have finished: without its layer it is debris.
    const rt = await m.runtimeOf(row);
    if (!(await rt.listLayers()).some((l) => l.id === row.layers![0])) {
      await softDelete(m, row);
      await m.store.update(row.id, { state: "destroyed", runnerId: null });
      return "failed";
    }
  }
  if (row.state === "error" || row.state === "build_failed") return "adopted"; // left for the user to see (and start again when its first process died, or delete)
  if ((row.state === "pending_build" || row.state === "building_snapshot") && row.desiredState === "started") {
    // A declarative build cut short by the restart: said so, rather than built again unasked.
    await m.store.update(row.id, { state: "build_failed", errorReason: "The build was interrupted by a restart of the server: create the sandbox again" });
    return "failed";
  }
  if (row.desiredState === "destroyed") return done(await driveDestroy(m, row));
  if (row.state === "resizing") {
    // The row holds the new size: applied again (a no-op where it was), then on as usual.
    if ((await driveResize(m, row)).failed !== undefined) return "failed";
    const then = await resume(m, { ...row, state: row.desiredState === "started" ? "started" : "stopped" }, onHost);
    return then === "adopted" ? "resumed" : then;
  }
  if (row.desiredState === "archived") {
    if (row.state === "archived") return "adopted"; // a leftover host copy is removed below
    return done(await driveArchive(m, row));
  }
  if (row.desiredState === "paused") {
    // Paused sandboxes stay frozen across a restart: adopted as they are, an interrupted pause finished.
    if (row.state === "paused" && onHost === "paused") return "adopted";
    if (onHost === "started" || onHost === "paused") return done(await drivePause(m, row));
    if (onHost === undefined) return done(await m.fail(row.id, new Error("the paused sandbox is gone from its host")));
    // Its processes ended without it (the host rebooted): its files are there, so it is stopped.
    await m.store.update(row.id, { desiredState: "stopped" });
    return done(await driveStop(m, row));
  }
  if (row.desiredState === "started") {
    if (row.state === "started" && onHost === "started") return "adopted";
    if (row.state === "paused" || onHost === "paused") return done(await driveResume(m, row)); // an interrupted resume
    if (row.state === "unknown" || row.state === "pulling_snapshot") {
      // The create (or its runner's pull of the image) never answered: whatever it left on the host (perhaps half made) goes first.
      await (await m.runtimeOf(row)).destroy(row.id);
      return done(await driveCreate(m, row));
    }
    if (row.state === "restoring") {
      const archive = m.files.archive(row.id);
      if (await m.files.exists(archive)) return done(await driveRestore(m, row, archive, "archived"));
      return done(await driveRestore(m, row, m.files.backup(row.id), "error"));
    }
    return done(await driveStart(m, row));
  }
  if (row.desiredState === "stopped") {
    if (row.state === "started" || row.state === "paused" || onHost === "started" || onHost === "paused") return done(await driveStop(m, row));
    return "adopted";
  }
  return "adopted";
}

async function inParallel(tasks: Array<() => Promise<void>>, n: number): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < tasks.length) await tasks[next++]();
  };
  await Promise.all(Array.from({ length: Math.min(n, tasks.length) }, worker));
}
