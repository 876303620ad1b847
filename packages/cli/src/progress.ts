/** A transfer's progress bar on a terminal (stderr); nothing at all when stderr is not a TTY. */
export interface Progress {
  add(bytes: number): void;
  done(): void;
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
function formatBytes(n: number): string {
  let i = 0;
  while (n >= 1024 && i < UNITS.length - 1) (n /= 1024), i++;
  return `${i === 0 ? n : n.toFixed(1)} ${UNITS[i]}`;
}

/** Redrawn at most every `intervalMs`; `total` undefined shows bytes and rate only. */
export function progressBar(label: string, total: number | undefined, stream: NodeJS.WriteStream = process.stderr, intervalMs = 100): Progress {
  const started = Date.now();
  let sent = 0;
  let last = 0;
  const enabled = Boolean(stream.isTTY);
  const draw = (final: boolean) => {
    const width = Math.max(10, Math.min(40, (stream.columns ?? 80) - label.length - 45));
    const secs = Math.max((Date.now() - started) / 1000, 0.001);
    const rate = `${formatBytes(sent / secs)}/s`;
    let line: string;
    if (total !== undefined && total > 0) {
      const frac = Math.min(1, sent / total);
      const filled = Math.round(frac * width);
      line = `${label} [${"#".repeat(filled)}${"-".repeat(width - filled)}] ${String(Math.floor(frac * 100)).padStart(3)}% ${formatBytes(sent)}/${formatBytes(total)} ${rate}`;
    } else {
      line = `${label} ${formatBytes(sent)} ${rate}`;
    }
    stream.write(`\r\x1b[2K${line}${final ? "\n" : ""}`);
  };
  return {
    add(bytes) {
      sent += bytes;
      if (!enabled) return;
      const now = Date.now();
      if (now - last >= intervalMs) {
        last = now;
        draw(false);
      }
    },
    done() {
      if (enabled) draw(true);
    },
  };
}
