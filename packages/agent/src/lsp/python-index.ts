import { execFile } from "node:child_process";
import { pathToFileURL } from "node:url";
import { errors } from "@sandbar/protocol";
import type { AgentContext } from "../context.ts";

// pylsp answers no workspace/symbol. Python workspace symbols come from an index of the project
// instead: every .py file parsed with the standard library's `ast` (the interpreter pylsp runs
// on, so nothing more to install), its classes, functions, methods and module-level names
// matched against the query as a case-insensitive substring, as editors do.

const MAX_RESULTS = 1000;
const TIMEOUT_MS = 30_000;

const SCRIPT = String.raw`
import ast, json, os, sys
root, query, limit = sys.argv[1], sys.argv[2].lower(), int(sys.argv[3])
SKIP = {"node_modules", "__pycache__", "venv", "site-packages", "dist-packages"}
out = []
def add(name, kind, path, node):
    if query in name.lower():
        out.append({"name": name, "kind": kind, "path": path, "line": node.lineno - 1, "character": node.col_offset,
                    "endLine": (getattr(node, "end_lineno", None) or node.lineno) - 1, "endCharacter": getattr(node, "end_col_offset", None) or node.col_offset})
def visit(body, path, in_class):
    for node in body:
        if isinstance(node, ast.ClassDef):
            add(node.name, 5, path, node)
            visit(node.body, path, True)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add(node.name, 6 if in_class else 12, path, node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and not in_class:
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(t, ast.Name):
                    add(t.id, 14 if t.id.isupper() else 13, path, node)
files = 0
for d, dirs, names in os.walk(root):
    dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x not in SKIP)
    for n in sorted(names):
        if not n.endswith((".py", ".pyi")) or len(out) >= limit or files >= 5000:
            continue
        p = os.path.join(d, n)
        files += 1
        try:
            if os.path.getsize(p) > 2_000_000:
                continue
            with open(p, "rb") as f:
                tree = ast.parse(f.read(), p)
        except Exception:
            continue
        visit(tree.body, p, False)
print(json.dumps(out[:limit]))
`;

interface Indexed {
  name: string;
  kind: number;
  path: string;
  line: number;
  character: number;
  endLine: number;
  endCharacter: number;
}

/** Symbols of the Python project at `projectDir` whose names contain `query`, in the LSP's flat shape. */
export function pythonWorkspaceSymbols(ctx: AgentContext, projectDir: string, query: string) {
  const python = ctx.env.SANDBAR_PYTHON || "python3";
  return new Promise<Array<{ name: string; kind: number; location: { uri: string; range: { start: { line: number; character: number }; end: { line: number; character: number } } } }>>(
    (resolve, reject) => {
      execFile(python, ["-c", SCRIPT, projectDir, query, String(MAX_RESULTS)], { cwd: projectDir, env: ctx.env, timeout: TIMEOUT_MS, maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
        if (err) {
          const why = (err as NodeJS.ErrnoException).code === "ENOENT" ? `${python} is not installed` : (err as { killed?: boolean }).killed ? "it took too long" : String(stderr).trim().split("\n").at(-1) || err.message;
          return reject(errors.failedPrecondition(`the Python workspace symbol index failed: ${why}`));
        }
        try {
          const found = JSON.parse(stdout) as Indexed[];
          resolve(
            found.map((s) => ({
              name: s.name,
              kind: s.kind,
              location: { uri: pathToFileURL(s.path).href, range: { start: { line: s.line, character: s.character }, end: { line: s.endLine, character: s.endCharacter } } },
            })),
          );
        } catch {
          reject(errors.failedPrecondition("the Python workspace symbol index gave an unreadable answer"));
        }
      });
    },
  );
}
