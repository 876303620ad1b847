/**
 * Go's filepath.Match pattern syntax, compiled to a RegExp: "*" any run of
 * characters but "/", "?" one such character, "[...]" a class ("^" negates,
 * "a-z" ranges), "\\" escapes. Returns an error text for a malformed pattern.
 */
export function compileGlob(pattern: string): RegExp | string {
  let re = "^";
  const chars = [...pattern];
  let i = 0;
  const escapeRe = (c: string) => c.replace(/[\\^$.*+?()[\]{}|/-]/g, "\\$&");
  while (i < chars.length) {
    const c = chars[i];
    if (c === "*") {
      re += "[^/]*";
      i++;
    } else if (c === "?") {
      re += "[^/]";
      i++;
    } else if (c === "\\") {
      if (i + 1 >= chars.length) return "pattern ends with an unfinished escape";
      re += escapeRe(chars[i + 1]);
      i += 2;
    } else if (c === "[") {
      i++;
      let cls = "[";
      if (chars[i] === "^") {
        cls += "^";
        i++;
      }
      let first = true;
      let closed = false;
      while (i < chars.length) {
        if (chars[i] === "]" && !first) {
          closed = true;
          i++;
          break;
        }
        first = false;
        let lo = chars[i];
        if (lo === "\\") {
          if (i + 1 >= chars.length) return "pattern ends with an unfinished escape";
          lo = chars[++i];
        }
        i++;
        if (chars[i] === "-" && i + 1 < chars.length && chars[i + 1] !== "]") {
          let hi = chars[i + 1];
          i += 2;
          if (hi === "\\") {
            if (i >= chars.length) return "pattern ends with an unfinished escape";
            hi = chars[i++];
          }
          if (hi.codePointAt(0)! < lo.codePointAt(0)!) return `bad range ${lo}-${hi} in pattern`;
          cls += `${escapeRe(lo)}-${escapeRe(hi)}`;
        } else {
          cls += escapeRe(lo);
        }
      }
      if (!closed) return "unterminated [ in pattern";
      re += cls + "]";
    } else {
      re += escapeRe(c);
      i++;
    }
  }
  return new RegExp(re + "$", "u");
}
