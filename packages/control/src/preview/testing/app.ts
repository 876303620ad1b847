/**
 * What the preview suites run inside a sandbox: a small web app in python3 (which the default
 * snapshot has), serving on one port:
 *   GET  /page          an HTML page whose script calls /info and the WebSocket below (browser test)
 *   GET  /big?mb=N      N MiB of bytes, written as fast as the connection takes them
 *   POST /sum           reads the body (Content-Length or chunked) and answers its length and SHA-256
 *   GET  /set-cookie?c= answers with the Set-Cookie header c (URL-encoded) besides its own
 *   GET  (Upgrade)      a WebSocket echo (text, binary, ping; close answered); with ?set-cookie
 *                       in the path its 101 sets a cookie for / on a domain
 *   anything else       JSON: the method, path and headers the app received
 */
export const APP_PY = String.raw`
import base64, hashlib, json, struct, sys, urllib.parse
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

PAGE = b"""<!doctype html><html><body><p id=out>loading</p><script>
(async () => {
  const info = await (await fetch('info?from=page')).json();
  const ws = new WebSocket(location.href.replace(/^http/, 'ws').replace(/[?#].*$/, '').replace(/page$/, 'ws'));
  const echoed = await new Promise((ok, fail) => { ws.onopen = () => ws.send('ping from the page'); ws.onmessage = (m) => ok(m.data); ws.onerror = () => fail('ws error'); });
  document.getElementById('out').textContent = 'path=' + info.path + ' echo=' + echoed;
})().catch((e) => { document.getElementById('out').textContent = 'failed: ' + e; });
</script></body></html>"""

class App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass

    def send(self, code, body, ctype="application/json", cookies=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "app=1; Path=/")
        for c in cookies: self.send_header("Set-Cookie", c)
        self.end_headers()
        if self.command != "HEAD": self.wfile.write(body)

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket": return self.websocket()
        if self.path.startswith("/big"):
            mb = int(self.path.split("mb=")[1]) if "mb=" in self.path else 100
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(mb << 20))
            self.end_headers()
            chunk = b"x" * (1 << 20)
            for _ in range(mb): self.wfile.write(chunk)
            return
        if self.path.startswith("/page"): return self.send(200, PAGE, "text/html")
        if self.path.startswith("/set-cookie"):
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            return self.send(200, b"{}", cookies=query.get("c", []))
        self.send(200, json.dumps({"method": self.command, "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}).encode())
    do_HEAD = do_GET
    do_DELETE = do_GET
    do_OPTIONS = do_GET

    def do_POST(self):
        digest, total = hashlib.sha256(), 0
        def take(left):
            nonlocal total
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 16))
                if not chunk: break
                digest.update(chunk); total += len(chunk); left -= len(chunk)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""): pass
                    break
                take(size)
                self.rfile.readline()
        else:
            take(int(self.headers.get("Content-Length", "0")))
        self.send(200, json.dumps({"length": total, "sha256": digest.hexdigest(), "path": self.path, "te": self.headers.get("Transfer-Encoding")}).encode())
    do_PUT = do_POST

    def websocket(self):
        accept = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        if "set-cookie" in self.path: self.send_header("Set-Cookie", "ws=1; Path=/; Domain=127.0.0.1")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while True:
            head = self.rfile.read(2)
            if len(head) < 2: return
            opcode, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126: n = struct.unpack(">H", self.rfile.read(2))[0]
            elif n == 127: n = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if opcode == 9: opcode = 10
            out = bytes([0x80 | opcode])
            out += bytes([len(data)]) if len(data) < 126 else (bytes([126]) + struct.pack(">H", len(data)) if len(data) < 65536 else bytes([127]) + struct.pack(">Q", len(data)))
            self.wfile.write(out + data)
            self.wfile.flush()
            if opcode == 8: return

ThreadingHTTPServer.allow_reuse_address = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), App).serve_forever()
`;
