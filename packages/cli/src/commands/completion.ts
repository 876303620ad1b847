import type { Command } from "commander";
import { CliError } from "../failure.ts";
import type { GlobalOptions } from "../global-options.ts";
import { run } from "../run.ts";

interface Node {
  path: string;
  words: string[];
  hasChildren: boolean;
}

/** Every command path with what may follow it: subcommands and options (the program's own tree, so it never goes stale). */
function nodes(cmd: Command, path = ""): Node[] {
  const subs = cmd.commands.filter((c) => !(c as Command & { _hidden?: boolean })._hidden);
  const options = cmd.options.flatMap((o) => [o.long, o.short].filter((f): f is string => Boolean(f)));
  const here: Node = { path, words: [...subs.flatMap((c) => [c.name()]), ...options, "--help"], hasChildren: subs.length > 0 };
  return [here, ...subs.flatMap((c) => nodes(c, `${path} ${c.name()}`))];
}

function bashCompletion(program: Command): string {
  const all = nodes(program);
  const descend = all.filter((n) => n.path !== "" && n.hasChildren).map((n) => `"${n.path}"`);
  const leaves = all.filter((n) => n.path !== "").map((n) => `"${n.path}"`);
  const cases = all.map((n) => `    "${n.path}") words="${n.words.join(" ")}" ;;`).join("\n");
  return `# sandbar completion for bash: eval "$(sandbar completion bash)" (e.g. in ~/.bashrc)
_sandbar() {
  local cur="\${COMP_WORDS[COMP_CWORD]}" path="" words="" i w
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="\${COMP_WORDS[i]}"
    [[ $w == -* ]] && continue
    case "$path $w" in
      ${leaves.join("|") || '""'}) ;;
      *) continue ;;
    esac
    case "$path" in
      ""|${descend.join("|") || '""'}) path="$path $w" ;;
    esac
  done
  case "$path" in
${cases}
  esac
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _sandbar sandbar
`;
}

function zshCompletion(program: Command): string {
  return `#compdef sandbar
# sandbar completion for zsh: eval "$(sandbar completion zsh)" (e.g. in ~/.zshrc), after compinit
autoload -U +X bashcompinit && bashcompinit
${bashCompletion(program).split("\n").slice(1).join("\n")}`;
}

export function completionCommand(program: Command): void {
  program
    .command("completion")
    .description("print a shell completion script: eval \"$(sandbar completion bash)\"")
    .argument("<shell>", "bash or zsh")
    .action(
      run(async (shell: string, _o: unknown, _g: GlobalOptions) => {
        if (shell === "bash") process.stdout.write(bashCompletion(program));
        else if (shell === "zsh") process.stdout.write(zshCompletion(program));
        else throw new CliError(`No completion for "${shell}": use bash or zsh.`, 2);
      }),
    );
}
