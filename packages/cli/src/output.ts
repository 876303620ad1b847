import { styleText } from "node:util";

/** How results are shown: tables and colours for people, JSON for scripts. */
export interface Output {
  json: boolean;
  /** Colours only on a TTY, and never with NO_COLOR (https://no-color.org). */
  color: boolean;
  /** A result: JSON on stdout with --json, otherwise the human form. */
  result(value: unknown, human: () => void): void;
  table(rows: Array<Record<string, unknown>>, columns: string[]): void;
  /** A line for people on stderr (progress, confirmations): silent with --json. */
  note(line: string): void;
  paint(style: "green" | "red" | "yellow" | "dim" | "bold" | "cyan", text: string): string;
}

export function colorWanted(stream: NodeJS.WriteStream, env: NodeJS.ProcessEnv = process.env): boolean {
  if (env.NO_COLOR !== undefined && env.NO_COLOR !== "") return false;
  if (env.FORCE_COLOR !== undefined && env.FORCE_COLOR !== "0") return true;
  return Boolean(stream.isTTY) && env.TERM !== "dumb";
}

export function makeOutput(opts: { json: boolean }): Output {
  const color = colorWanted(process.stdout);
  const out: Output = {
    json: opts.json,
    color,
    result(value, human) {
      if (opts.json) process.stdout.write(JSON.stringify(value, jsonReplacer, 2) + "\n");
      else human();
    },
    table(rows, columns) {
      process.stdout.write(formatTable(rows, columns, (t) => out.paint("bold", t)));
    },
    note(line) {
      if (!opts.json) process.stderr.write(line + "\n");
    },
    paint(style, text) {
      return color ? styleText(style, text, { validateStream: false }) : text;
    },
  };
  return out;
}

/** bigint (int64 fields) as a number when it fits, else a string; Uint8Array as base64. */
function jsonReplacer(_key: string, value: unknown): unknown {
  if (typeof value === "bigint") return Number.isSafeInteger(Number(value)) ? Number(value) : value.toString();
  if (value instanceof Uint8Array) return Buffer.from(value).toString("base64");
  return value;
}

/** Plain columns padded to the widest cell; the header painted by `head`. */
export function formatTable(rows: Array<Record<string, unknown>>, columns: string[], head: (t: string) => string = (t) => t): string {
  const cell = (v: unknown) => (v === undefined || v === null ? "" : v instanceof Date ? v.toISOString() : String(v));
  const cells = rows.map((r) => columns.map((c) => cell(r[c])));
  const widths = columns.map((c, i) => Math.max(c.length, ...cells.map((r) => r[i]!.length)));
  const line = (vals: string[]) => vals.map((v, i) => (i === vals.length - 1 ? v : v.padEnd(widths[i]!))).join("  ").trimEnd() + "\n";
  const header = head(line(columns.map((c) => c.toUpperCase())).trimEnd()) + "\n";
  return header + cells.map(line).join("");
}
