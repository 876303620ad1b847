import { toJson, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";

/** A message in the proto JSON form (what --json prints). */
export function asJson<D extends DescMessage>(schema: D, message: MessageShape<D>): unknown {
  return toJson(schema, message, { alwaysEmitImplicit: false });
}

/** An enum value's short name for people: SANDBOX_STATE_STARTED -> started. */
export function enumLabel(names: Record<number, string>, value: number, prefix: string): string {
  return (names[value] ?? String(value)).replace(prefix, "").toLowerCase().replace(/_/g, " ");
}

export function when(ts: Timestamp | undefined): string {
  if (!ts) return "";
  return timestampDate(ts).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
