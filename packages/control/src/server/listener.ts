import http from "node:http";
import http2 from "node:http2";
import net from "node:net";

type Handler = (req: http.IncomingMessage | http2.Http2ServerRequest, res: http.ServerResponse | http2.Http2ServerResponse) => void;

/**
 * One TCP port for HTTP/1.1 and cleartext HTTP/2 (h2c with prior knowledge, as gRPC uses):
 * the first bytes of each connection say which; the connection is handed to that server.
 */
export function listenOnePort(handler: Handler, port: number, host: string): Promise<net.Server> {
  const h1 = http.createServer({ keepAliveTimeout: 65_000, requestTimeout: 0 }, handler as http.RequestListener);
  const h2 = http2.createServer({}, handler as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void);
  const server = net.createServer((socket) => {
    socket.once("data", (first) => {
      socket.pause();
      socket.unshift(first);
      (first.subarray(0, 3).toString("latin1") === "PRI" ? h2 : h1).emit("connection", socket);
      process.nextTick(() => socket.resume());
    });
    socket.on("error", () => socket.destroy());
  });
  server.on("close", () => {
    h1.close();
    h1.closeAllConnections();
    h2.close();
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve(server));
  });
}
