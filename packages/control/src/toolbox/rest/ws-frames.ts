import { ConnectError } from "@connectrpc/connect";
import { WebSocket } from "ws";

/** Past this many unsent bytes a sender waits for the client to read. */
const HIGH_WATER = 4 * 1024 * 1024;

/** Sends a frame (a string as text, bytes as binary), waiting while the client falls behind. */
export function sendFrame(ws: WebSocket, data: string | Uint8Array): Promise<void> {
  if (ws.readyState !== WebSocket.OPEN) return Promise.reject(new Error("the WebSocket is closed"));
  return new Promise((resolve, reject) => {
    const wait = ws.bufferedAmount > HIGH_WATER;
    ws.send(data, { binary: typeof data !== "string" }, (err) => {
      if (!wait) return;
      if (err) reject(err);
      else resolve();
    });
    if (!wait) resolve();
  });
}

/** A close frame; the reason is cut to the 123 bytes a close frame carries. */
export function closeWith(ws: WebSocket, code: number, reason: string): void {
  if (ws.readyState !== WebSocket.OPEN) return;
  let r = Buffer.from(reason, "utf8");
  if (r.length > 123) r = r.subarray(0, 120);
  ws.close(code, r.toString("utf8").replace(/\uFFFD$/, ""));
}

/** An error's message for a human, without Connect's code prefix. */
export function messageOf(err: unknown): string {
  if (err instanceof ConnectError) return err.rawMessage;
  return err instanceof Error ? err.message : String(err);
}
