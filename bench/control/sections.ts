/**
 * RESULTS.md holds the main run's report and sections other runs add (the rate limiter's cost):
 * each such section sits between markers and survives the other runs' rewrites.
 */
const begin = (name: string) => `<!-- section:${name} -->`;
const end = (name: string) => `<!-- /section:${name} -->`;

/** The marked sections of a file's text, markers included (to append to a rewritten report). */
export function sectionsOf(text: string): string {
  return [...text.matchAll(/<!-- section:([\w-]+) -->[\s\S]*?<!-- \/section:\1 -->\n?/g)].map((m) => m[0]).join("");
}

/** `text` with section `name` replaced by `content` (appended when absent). */
export function withSection(text: string, name: string, content: string): string {
  const block = `${begin(name)}\n${content.trim()}\n${end(name)}\n`;
  const at = text.indexOf(begin(name));
  if (at < 0) return `${text.trimEnd()}\n\n${block}`;
  const stop = text.indexOf(end(name), at);
  return text.slice(0, at) + block + text.slice(stop < 0 ? text.length : text.indexOf("\n", stop) + 1 || text.length);
}
