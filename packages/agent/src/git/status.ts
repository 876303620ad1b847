import { GitFileStatus } from "@sandbar/protocol/gen/sandbar/agent/v1/git_pb.js";

/** One status letter of `git status --porcelain=v2` in the reference's words. */
function word(letter: string): GitFileStatus {
  switch (letter) {
    case ".":
      return GitFileStatus.UNMODIFIED;
    case "M":
    case "T":
      return GitFileStatus.MODIFIED;
    case "A":
      return GitFileStatus.ADDED;
    case "D":
      return GitFileStatus.DELETED;
    case "R":
      return GitFileStatus.RENAMED;
    case "C":
      return GitFileStatus.COPIED;
    case "U":
      return GitFileStatus.UPDATED_BUT_UNMERGED;
    case "?":
      return GitFileStatus.UNTRACKED;
    default:
      return GitFileStatus.UNSPECIFIED;
  }
}

export interface ParsedStatus {
  currentBranch: string;
  upstream: string | undefined;
  ahead: number;
  behind: number;
  fileStatus: { name: string; extra: string; staging: GitFileStatus; worktree: GitFileStatus }[];
}

/** Parses `git status --porcelain=v2 --branch -z --untracked-files=all`. */
export function parseStatus(out: string): ParsedStatus {
  const result: ParsedStatus = { currentBranch: "HEAD", upstream: undefined, ahead: 0, behind: 0, fileStatus: [] };
  const records = out.split("\0");
  for (let i = 0; i < records.length; i++) {
    const rec = records[i];
    if (rec === "") continue;
    if (rec.startsWith("# branch.head ")) {
      const head = rec.slice("# branch.head ".length);
      result.currentBranch = head === "(detached)" ? "HEAD" : head;
    } else if (rec.startsWith("# branch.upstream ")) {
      result.upstream = rec.slice("# branch.upstream ".length);
    } else if (rec.startsWith("# branch.ab ")) {
      const m = /^# branch\.ab \+(\d+) -(\d+)/.exec(rec);
      if (m) {
        result.ahead = Number(m[1]);
        result.behind = Number(m[2]);
      }
    } else if (rec.startsWith("1 ")) {
      // 1 XY sub mH mI mW hH hI path
      const f = rec.split(" ");
      result.fileStatus.push({ name: f.slice(8).join(" "), extra: "", staging: word(f[1][0]), worktree: word(f[1][1]) });
    } else if (rec.startsWith("2 ")) {
      // 2 XY sub mH mI mW hH hI Xscore path, then the original path as the next record.
      const f = rec.split(" ");
      const orig = records[++i] ?? "";
      result.fileStatus.push({ name: f.slice(9).join(" "), extra: orig, staging: word(f[1][0]), worktree: word(f[1][1]) });
    } else if (rec.startsWith("u ")) {
      // u XY sub m1 m2 m3 mW h1 h2 h3 path
      const f = rec.split(" ");
      result.fileStatus.push({ name: f.slice(10).join(" "), extra: "", staging: GitFileStatus.UPDATED_BUT_UNMERGED, worktree: GitFileStatus.UPDATED_BUT_UNMERGED });
    } else if (rec.startsWith("? ")) {
      const name = rec.slice(2);
      result.fileStatus.push({ name, extra: "", staging: GitFileStatus.UNTRACKED, worktree: GitFileStatus.UNTRACKED });
    }
  }
  return result;
}
