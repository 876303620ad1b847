// Runs as written: `SANDBAR_API_KEY=<key> node packages/sdk/examples/quickstart.mjs`
// (SANDBAR_API_URL defaults to http://localhost:3000/api; a .env file or the CLI's config file work too).
import { Sandbar, NotFoundError } from "@sandbar/sdk";

const sandbar = new Sandbar();
const sandbox = await sandbar.sandboxes.create({ labels: { example: "quickstart" } });
try {
  const { exitCode, result } = await sandbox.process.exec("echo hello from $(whoami)");
  console.log(`exit ${exitCode}: ${result.trim()}`);

  // Files: relative paths start in the sandbox's work dir; uploads and downloads are streamed.
  await sandbox.fs.upload("notes/hello.txt", "written by @sandbar/sdk\n");
  console.log(`read back: ${(await sandbox.fs.readFile("notes/hello.txt")).toString().trim()}`);

  // A command in a session, its output followed as it is written.
  await sandbox.process.createSession("build");
  const cmd = await sandbox.process.sessionExec("build", "for i in 1 2 3; do echo step $i; sleep 0.2; done", { async: true });
  for await (const chunk of sandbox.process.logs("build", cmd.cmdId)) {
    process.stdout.write(`${chunk.data.case}: ${new TextDecoder().decode(chunk.data.value)}`);
  }

  // Errors are typed.
  await sandbar.sandboxes.get("no-such-sandbox").catch((err) => {
    if (err instanceof NotFoundError) console.log(`not found (${err.status}): ${err.message}`);
    else throw err;
  });
} finally {
  await sandbox.delete();
  sandbar.close();
}
