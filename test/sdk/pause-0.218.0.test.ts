import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { load, runLabel, startRealServer, type RealServer } from "./support.ts";
import { eventually } from "../../packages/protocol/src/testing/eventually.ts";

// SDK 0.218.0's pause on a real sandbox running the real agent: `sandbox.pause()` (pausing, then
// paused), `sandbox.start()` resuming it with a session's log follower and a PTY still attached,
// `setAutoPauseInterval`, `create({ autoPauseInterval })`, and a toolbox call or a PTY's WebSocket
// on a paused sandbox resuming it transparently.

type Sdk = typeof import("sdk-0218");
const sdk = load<Sdk>("sdk-0218");

let s: RealServer;
let daytona: import("sdk-0218").Daytona;
const label = runLabel();

beforeAll(async () => {
  s = await startRealServer();
  daytona = new sdk.Daytona({ apiKey: s.adminKey, apiUrl: s.apiUrl, target: "local", useDeprecatedPolling: true });
}, 600_000);
afterAll(async () => {
  await daytona?.[Symbol.asyncDispose]?.();
  await s?.stop();
});

describe("SDK 0.218.0 pause", () => {
  it("pause and start: a session's log follower and a PTY live through it, the loop's state kept", async () => {
    const sandbox = await daytona.create({ labels: { suite: label }, autoStopInterval: 0 }, { timeout: 120 });
    const p = sandbox.process;

    // A command counting in a session, its log followed over the SDK's WebSocket.
    await p.createSession("paused");
    const counting = await p.executeSessionCommand("paused", { command: "for i in $(seq 1 30); do echo tick$i; sleep 0.1; done", runAsync: true });
    let followed = "";
    const follower = p.getSessionCommandLogs("paused", counting.cmdId!, (c) => (followed += c), () => undefined);
    // A PTY holding a shell variable set before the pause.
    let output = "";
    const decoder = new TextDecoder();
    const pty = await p.createPty({ id: "pty-pause", cols: 80, rows: 20, onData: (d: Uint8Array) => void (output += decoder.decode(d, { stream: true })) });
    await pty.sendInput("KEPT=before-pause; echo set-$KEPT\n");
    await eventually("the PTY to answer", () => output.includes("set-before-pause"));
    await eventually("the count to begin", () => followed.includes("tick3"));

    await sandbox.pause();
    expect(sandbox.state).toBe("paused");
    const seen = followed;
    expect(seen).not.toContain("tick30"); // paused mid-count
    expect((await daytona.get(sandbox.id)).state).toBe("paused");
    await sandbox.pause(); // idempotent
    expect(sandbox.state).toBe("paused");

    await sandbox.start();
    expect(sandbox.state).toBe("started");
    await follower;
    // Every tick once and in order: the follower's stream was held across the pause, not restarted.
    expect(followed.trim().split("\n")).toEqual(Array.from({ length: 30 }, (_, i) => `tick${i + 1}`));
    await pty.sendInput('echo "after-$KEPT"\n');
    await eventually("the PTY to answer after the resume", () => output.includes("after-before-pause"));
    await pty.sendInput("exit 0\n");
    expect((await pty.wait()).exitCode).toBe(0);
    await daytona.delete(sandbox);
  });

  it("a toolbox call and a terminal's WebSocket to a paused sandbox resume it; setAutoPauseInterval and create with autoPauseInterval", async () => {
    const sandbox = await daytona.create({ labels: { suite: label }, autoPauseInterval: 30 }, { timeout: 120 });
    expect(sandbox.autoPauseInterval).toBe(30);
    expect(sandbox.autoStopInterval).toBe(0);
    await sandbox.fs.uploadFile(Buffer.from("in the file\n"), "note.txt");

    await sandbox.pause();
    expect(sandbox.state).toBe("paused");
    // The toolbox call waits for the resume rather than failing.
    expect((await sandbox.process.executeCommand("cat note.txt")).result).toBe("in the file\n");
    await sandbox.refreshData();
    expect(sandbox.state).toBe("started");

    // A terminal's WebSocket to a paused sandbox resumes it too: a PTY made before, reconnected while paused.
    let output = "";
    const decoder = new TextDecoder();
    const first = await sandbox.process.createPty({ id: "pty-wake", cols: 80, rows: 20, onData: (d: Uint8Array) => void (output += decoder.decode(d, { stream: true })) });
    await first.sendInput("WAKE=kept; echo ready-$WAKE\n");
    await eventually("the PTY to answer", () => output.includes("ready-kept"));
    await first.disconnect();
    await sandbox.pause();
    expect(sandbox.state).toBe("paused");
    output = "";
    const again = await sandbox.process.connectPty("pty-wake", { onData: (d: Uint8Array) => void (output += decoder.decode(d, { stream: true })) });
    await again.waitForConnection();
    await again.sendInput("echo woke-$WAKE\n");
    await eventually("the reconnected PTY to answer", () => output.includes("woke-kept"));
    await sandbox.refreshData();
    expect(sandbox.state).toBe("started");
    await again.kill();

    await sandbox.setAutoPauseInterval(0);
    expect(sandbox.autoPauseInterval).toBe(0);
    await sandbox.setAutostopInterval(15);
    await expect(sandbox.setAutoPauseInterval(60)).rejects.toThrow("autoStopInterval and autoPauseInterval are mutually exclusive");
    await sandbox.setAutostopInterval(0);
    await sandbox.setAutoPauseInterval(60);
    await sandbox.refreshData();
    expect(sandbox.autoPauseInterval).toBe(60);
    await expect(sandbox.setAutoPauseInterval(-1)).rejects.toThrow("autoPauseInterval must be a non-negative integer");

    await sandbox.stop();
    await expect(sandbox.pause()).rejects.toThrow("Sandbox must be in started state to pause");
    await daytona.delete(sandbox);
  });
});
