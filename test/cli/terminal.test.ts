/**
 * The `sandbar` CLI driven in a real terminal (tmux: keys sent, screen read) against a real
 * server with real sandboxes: browser sign-in completed by headless chromium (PKCE, loopback
 * redirect), the token refreshed when expired, then exec, logs -f, cp with its progress bar and
 * an interactive shell resized with the window, all acting as the signed-in person (JWT).
 */
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { randomBytes } from "node:crypto";
import { chromium, type BrowserContext } from "playwright-core";
import { startTestServer, type TestServer } from "@sandbar/control/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI } from "./run-cli.ts";
import { eventually } from "../../packages/protocol/src/testing/eventually.ts";
import { Tmux } from "./tmux.ts";

const PASSWORD = "correct horse battery staple 42";
const CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"];

let t: TestServer;
let dir: string;
let term: Tmux;
let browser: BrowserContext;
let configFile: string;

beforeAll(async () => {
  t = await startTestServer({ settings: { bootstrapPassword: PASSWORD } });
  dir = await mkdtemp(join(tmpdir(), "sandbar-cli-term-"));
  // `sandbar` on the terminal's PATH, run by the node running the tests.
  const bin = join(dir, "bin");
  await import("node:fs/promises").then((fs) => fs.mkdir(bin));
  await writeFile(join(bin, "sandbar"), `#!/bin/sh\nexec "${process.execPath}" "${CLI}" "$@"\n`, { mode: 0o755 });
  configFile = join(dir, "config", "config.json");
  term = new Tmux();
  term.start({
    cols: 100,
    rows: 30,
    env: { PATH: `${bin}:${dirname(process.execPath)}:/usr/bin:/bin`, SANDBAR_CONFIG_DIR: join(dir, "config"), SANDBAR_API_URL: `${t.url}/api`, SANDBAR_NO_BROWSER: "1", TERM: "xterm-256color", HOME: dir },
  });
  await term.waitFor(/host\$ $/m);
  browser = await chromium.launchPersistentContext(join(dir, "chromium"), { executablePath: "/usr/bin/chromium", headless: true, args: CHROMIUM_ARGS });
});

afterAll(async () => {
  term?.kill();
  await browser?.close();
  await t?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** Runs a command line in the terminal and waits for the prompt after it; returns what it printed. */
async function sh(command: string, timeoutMs = 60_000): Promise<string> {
  term.clear();
  const marker = `done-${randomBytes(3).toString("hex")}`;
  term.line(`${command}; echo "${marker} rc=$?"`);
  const screen = await term.waitFor(new RegExp(`^${marker} rc=\\d+`, "m"), timeoutMs);
  return screen.slice(0, screen.search(new RegExp(`^${marker} rc=`, "m")));
}
const rcOf = (screen: string) => Number(/rc=(\d+)/.exec(screen.split("\n").reverse().find((l) => /^done-\w+ rc=/.test(l)) ?? "")?.[1]);

describe("sandbar in a terminal", () => {
  let box: string;

  it("login: the printed URL, signed in by a headless browser, lands in the loopback listener; tokens saved 0600", async () => {
    term.clear();
    term.line("sandbar login");
    const screen = await term.waitFor(/Waiting for the browser/);
    const url = /(http:\/\/127\.0\.0\.1:\d+\/oidc\/auth\?\S+)/.exec(screen)?.[1];
    expect(url).toBeTruthy();
    const authorize = new URL(url!);
    expect(authorize.searchParams.get("code_challenge_method")).toBe("S256");
    expect(authorize.searchParams.get("redirect_uri")).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/callback$/);
    const page = await browser.newPage();
    try {
      page.setDefaultTimeout(15_000);
      await page.goto(url!);
      await page.fill("#login", "sandbar-admin");
      await page.fill("#password", PASSWORD);
      await Promise.all([page.waitForURL((u) => u.pathname === "/callback", { timeout: 20_000 }), page.click("button[type=submit]")]);
      expect(await page.textContent("body")).toContain("Signed in to Sandbar");
    } finally {
      await page.close();
    }
    const after = await term.waitFor(/Signed in as .*\n.*Acting in Default/);
    expect(after).toContain(`at ${t.url}/api`);
    const { stat } = await import("node:fs/promises");
    expect((await stat(configFile)).mode & 0o777).toBe(0o600);
    const saved = JSON.parse(await readFile(configFile, "utf8")).profiles.default;
    expect(saved).toMatchObject({ apiUrl: `${t.url}/api`, jwtToken: expect.stringMatching(/^ey/), refreshToken: expect.any(String), organizationId: expect.any(String) });
    expect(saved.apiKey).toBeUndefined();

    const who = await sh("sandbar whoami");
    expect(who).toMatch(/sandbar-admin|admin/);
    expect(who).toMatch(/organization: Default \([0-9a-f-]{36}\)/);
    expect(rcOf(term.screen())).toBe(0);
  });

  it("an expired access token is refreshed with the refresh token (rotated) before the call", async () => {
    const file = JSON.parse(await readFile(configFile, "utf8"));
    const before = file.profiles.default;
    file.profiles.default.tokenExpiresAt = new Date(Date.now() - 1000).toISOString();
    await writeFile(configFile, JSON.stringify(file), { mode: 0o600 });
    const out = await sh("sandbar org list");
    expect(out).toMatch(/\*\s+[0-9a-f-]{36}\s+Default/);
    const now = JSON.parse(await readFile(configFile, "utf8")).profiles.default;
    expect(now.jwtToken).not.toBe(before.jwtToken);
    expect(now.refreshToken).not.toBe(before.refreshToken);
    expect(Date.parse(now.tokenExpiresAt)).toBeGreaterThan(Date.now() + 30 * 60_000);

    // org use by name or id; an organization one is not in is refused with where to look.
    expect(await sh("sandbar org use Default")).toMatch(/Now acting in Default \([0-9a-f-]{36}\)\./);
    expect(await sh("sandbar org use elsewhere")).toMatch(/sandbar: You are not a member of an organization "elsewhere": `sandbar org list` shows yours\./);
    expect(rcOf(term.screen())).toBe(1);
  });

  it("sandbox create and exec: output on the screen, the exit code in $?", async () => {
    const created = await sh("sandbar sandbox create --name term-box");
    expect(created).toMatch(/state\s+started/);
    box = /id\s+([0-9a-f-]{36})/.exec(created)![1]!;
    const out = await sh("sandbar exec term-box 'echo hello from $(hostname -s 2>/dev/null || echo box); exit 7'");
    expect(out).toContain("hello from");
    expect(rcOf(term.screen())).toBe(7);
  });

  it("a sign-in that expires during a long command is refreshed on the way, and the command finishes", async () => {
    const file = JSON.parse(await readFile(configFile, "utf8"));
    const before = file.profiles.default.jwtToken;
    // Fresh enough at the start (more than the minute's margin), not by the command's last call.
    file.profiles.default.tokenExpiresAt = new Date(Date.now() + 75_000).toISOString();
    await writeFile(configFile, JSON.stringify(file), { mode: 0o600 });
    const out = await sh("sandbar exec term-box 'sleep 17; echo slept'", 90_000);
    expect(out).toMatch(/^slept$/m);
    expect(rcOf(term.screen())).toBe(0);
    const now = JSON.parse(await readFile(configFile, "utf8")).profiles.default;
    expect(now.jwtToken).not.toBe(before);
    expect(Date.parse(now.tokenExpiresAt)).toBeGreaterThan(Date.now() + 30 * 60_000);
  });

  it("logs -f follows a running command's output as it is written, and returns when it exits", async () => {
    const started = await sh("sandbar exec --session ticks -d term-box 'for i in 1 2 3 4 5 6; do echo tick-$i; sleep 0.7; done'");
    expect(started).toMatch(/[0-9a-f-]{36}/);
    term.clear();
    term.line("sandbar logs -f term-box ticks; echo logs-rc=$?");
    // An early line shows while the last is not yet written: followed, not buffered to the end.
    const early = await term.waitFor(/^tick-2$/m, 20_000);
    expect(early).not.toMatch(/tick-6/);
    const end = await term.waitFor(/^logs-rc=\d+/m, 20_000);
    expect(end).toMatch(/tick-1\ntick-2\ntick-3\ntick-4\ntick-5\ntick-6\nlogs-rc=0/);
  });

  it("cp shows a progress bar on the terminal, both ways, and the bytes arrive intact", async () => {
    const local = join(dir, "big.bin");
    const data = randomBytes(48 * 1024 * 1024);
    await writeFile(local, data);
    const up = await sh(`sandbar cp ${local} term-box:/tmp/big.bin`);
    expect(up).toMatch(/big\.bin \[#+\] 100% 48\.0 MiB\/48\.0 MiB [\d.]+ [KMG]iB\/s/);
    expect(up).toContain("Copied ");
    const down = await sh(`sandbar cp term-box:/tmp/big.bin ${join(dir, "back.bin")}`);
    expect(down).toMatch(/big\.bin \[#+\] 100% 48\.0 MiB\/48\.0 MiB/);
    expect(Buffer.compare(await readFile(join(dir, "back.bin")), data)).toBe(0);
  });

  it("shell: an interactive PTY whose size follows the window (stty size), and its exit code", async () => {
    term.clear();
    term.line("sandbar shell term-box; echo shell-rc=$?");
    // Inside: a prompt of our own to tell it from the host's. Typed again until the sandbox's shell
    // takes it (what is typed before the CLI has its PTY may not reach it; the line is idempotent).
    await eventually("the sandbox's shell", async () => {
      term.line("export PS1='box# '");
      return term.waitFor(/^box# $/m, 2000).then(() => true, () => false);
    }, 30_000);
    term.clear();
    term.line("stty size");
    await term.waitFor(/^30 100$/m);
    term.resize(120, 40);
    // SIGWINCH reaches the CLI, which resizes the sandbox's PTY: asked until the new size shows.
    await eventually("the sandbox's PTY to take the new size", async () => {
      term.clear();
      term.line("stty size");
      return term.waitFor(/^\d+ \d+$/m, 5000).then((screen) => /^40 120$/m.test(screen), () => false);
    }, 30_000);
    // Raw mode: Ctrl-C goes to the sandbox's shell, not to the CLI.
    // The quotes keep the typed line from matching: "sleeping" shows once the shell runs it.
    term.line("echo sl''eeping; sleep 600");
    await term.waitFor(/^sleeping$/m);
    term.keys("C-c");
    // Still the sandbox's shell (its prompt), not the host's after a CLI that quit: the host's shell
    // would run the lines below too, and `exit 5` would end the terminal every later test needs.
    term.line("echo still-''here");
    const screen = await term.waitFor(/^still-here\n(box# |host\$ )/m);
    expect(screen).not.toMatch(/shell-rc=/);
    // Guarded: only the sandbox's shell has /opt/sandbar/agent, so a host shell that got the line
    // (a CLI that quit meanwhile) stays, the screen says why, and the next tests keep their terminal.
    term.line("test -d /opt/sandbar/agent && exit 5");
    await term.waitFor(/^shell-rc=5$/m, 20_000);
  });

  it("logout forgets the tokens; the next command says to log in", async () => {
    const out = await sh("sandbar logout");
    expect(out).toMatch(/Logged out of/);
    const saved = JSON.parse(await readFile(configFile, "utf8")).profiles.default;
    expect(saved.jwtToken).toBeUndefined();
    expect(saved.refreshToken).toBeUndefined();
    const after = await sh("sandbar sandbox list");
    expect(after).toMatch(/sandbar: Not signed in to .*run `sandbar login`/);
    expect(rcOf(term.screen())).toBe(1);
    void box;
  });
});
