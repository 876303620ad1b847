import type { BigIntStats, Stats } from "node:fs";
import * as path from "node:path";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { FileInfoSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";

type FileInfoInit = MessageInitShape<typeof FileInfoSchema>;

const S_IFMT = 0o170000;
const S_IFDIR = 0o040000;
const S_IFLNK = 0o120000;
const S_IFIFO = 0o010000;
const S_IFSOCK = 0o140000;
const S_IFCHR = 0o020000;
const S_IFBLK = 0o060000;

/**
 * The reference's mode text (Go's FileMode.String()): type letters from
 * "dalTLDpSugct" in that order, or "-", then rwxrwxrwx.
 */
function modeString(mode: number): string {
  const type = mode & S_IFMT;
  let letters = "";
  if (type === S_IFDIR) letters += "d";
  if (type === S_IFLNK) letters += "L";
  if (type === S_IFCHR || type === S_IFBLK) letters += "D";
  if (type === S_IFIFO) letters += "p";
  if (type === S_IFSOCK) letters += "S";
  if (mode & 0o4000) letters += "u";
  if (mode & 0o2000) letters += "g";
  if (type === S_IFCHR) letters += "c";
  if (mode & 0o1000) letters += "t";
  if (letters === "") letters = "-";
  const rwx = "rwxrwxrwx";
  let perm = "";
  for (let i = 0; i < 9; i++) perm += mode & (1 << (8 - i)) ? rwx[i] : "-";
  return letters + perm;
}

/** Go's time.String() of a UTC time: "2006-01-02 15:04:05.999999999 +0000 UTC" (trailing zeros trimmed). */
function goTimeString(ns: bigint): string {
  const ms = Number(ns / 1_000_000n);
  const d = new Date(ms);
  const pad = (n: number, w = 2) => String(n).padStart(w, "0");
  const date = `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}`;
  const time = `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`;
  let frac = String(((ns % 1_000_000_000n) + 1_000_000_000n) % 1_000_000_000n).padStart(9, "0");
  frac = frac.replace(/0+$/, "");
  return `${date} ${time}${frac ? "." + frac : ""} +0000 UTC`;
}

function isDir(st: Stats | BigIntStats): boolean {
  return (Number(st.mode) & S_IFMT) === S_IFDIR;
}

/** FileInfo of a stat taken with { bigint: true } (nanosecond times). */
export function fileInfo(p: string, st: BigIntStats): FileInfoInit {
  const mode = Number(st.mode);
  return {
    name: path.basename(p),
    isDir: isDir(st),
    size: st.size,
    modTime: goTimeString(st.mtimeNs),
    mode: modeString(mode),
    permissions: "0" + (mode & 0o777).toString(8).padStart(3, "0"),
    owner: String(st.uid),
    group: String(st.gid),
    modifiedAt: {
      ...timestampFromMs(Number(st.mtimeNs / 1_000_000n)),
      nanos: Number(st.mtimeNs % 1_000_000_000n),
    },
  };
}
