/** The built-in issuer's pages: plain HTML, inline style, no scripts, nothing fetched from elsewhere. */

const escape = (s: string) => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

const STYLE = `body{font-family:system-ui,sans-serif;background:#f4f5f7;margin:0;display:flex;min-height:100vh;align-items:center;justify-content:center}
main{background:#fff;padding:2rem 2.5rem;border-radius:8px;box-shadow:0 1px 4px #0002;width:20rem}
h1{font-size:1.25rem;margin:0 0 1rem}label{display:block;margin:.75rem 0 .25rem;font-size:.9rem}
input{width:100%;box-sizing:border-box;padding:.5rem;font-size:1rem;border:1px solid #bbb;border-radius:4px}
button{margin-top:1.25rem;width:100%;padding:.6rem;font-size:1rem;border:0;border-radius:4px;background:#2457d6;color:#fff;cursor:pointer}
.error{color:#b00020;font-size:.9rem;margin:.5rem 0}.client{color:#555;font-size:.85rem}`;

function layout(title: string, body: string): string {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>${escape(title)}</title><style>${STYLE}</style></head><body><main>${body}</main></body></html>`;
}

export function loginPage(opts: { action: string; clientName: string; login?: string; error?: string }): string {
  return layout(
    "Sign in to Sandbar",
    `<h1>Sign in to Sandbar</h1><p class="client">to continue to ${escape(opts.clientName)}</p>
${opts.error ? `<p class="error" role="alert">${escape(opts.error)}</p>` : ""}
<form method="post" action="${escape(opts.action)}" autocomplete="on">
<label for="login">E-mail or user name</label><input id="login" name="login" autocomplete="username" required autofocus value="${escape(opts.login ?? "")}">
<label for="password">Password</label><input id="password" name="password" type="password" autocomplete="current-password" required>
<button type="submit">Sign in</button></form>`,
  );
}

export function errorPage(message: string): string {
  return layout("Sign-in error", `<h1>Sign-in error</h1><p class="error">${escape(message)}</p>`);
}
