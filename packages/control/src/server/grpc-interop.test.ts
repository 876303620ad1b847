import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { ConnectError, Code } from "@sandbar/protocol";
import { ApiKeyService } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../testing/server.ts";

// The API-key service over gRPC from @grpc/grpc-js (an independent stack), on the same port
// as REST, plus health and reflection; and the Connect, gRPC and gRPC-Web protocols of connect-es.

const protoRoot = fileURLToPath(new URL("../../../../proto", import.meta.url));
/** The client class of `service` (its full name) from the proto file that declares it. */
function load(file: string, service: string): grpc.ServiceClientConstructor {
  let node: grpc.GrpcObject[string] = grpc.loadPackageDefinition(
    protoLoader.loadSync(file, { includeDirs: [protoRoot, `${protoRoot}/vendor`], keepCase: false, longs: Number, enums: String, defaults: true }),
  );
  for (const name of service.split(".")) {
    if (typeof node === "function" || isTypeDefinition(node)) throw new Error(`${service}: ${name} is not in a package`);
    node = node[name];
  }
  if (typeof node !== "function") throw new Error(`${file} declares no service ${service}`);
  return node;
}
const isTypeDefinition = (node: grpc.GrpcObject | grpc.ProtobufTypeDefinition): node is grpc.ProtobufTypeDefinition => "format" in node && typeof node.format === "string";

type ServiceClient = InstanceType<grpc.ServiceClientConstructor>;

/** One unary call through grpc-js's generic client (methods by name), the answer as proto-loader's plain object. */
function call<T>(client: ServiceClient, method: string, req: object, key?: string): Promise<T> {
  const md = new grpc.Metadata();
  if (key) md.set("authorization", `Bearer ${key}`);
  const unary = client[method];
  if (typeof unary !== "function") throw new Error(`no method ${method}`);
  return new Promise((resolve, reject) => unary.call(client, req, md, (err: grpc.ServiceError | null, res: T) => (err ? reject(err) : resolve(res))));
}

// The answers as proto-loader spells them (camelCase fields, enums as their names).
interface ApiKey {
  name: string;
  value: string;
  permissions: string[];
}
interface ReflectionReply {
  listServicesResponse?: { service: Array<{ name: string }> };
  fileDescriptorResponse?: { fileDescriptorProto: Buffer[] };
  errorResponse?: { errorCode: number };
}

let t: TestServer;
let apiKeys: ServiceClient;
const target = () => t.url.replace("http://", "");

beforeAll(async () => {
  t = await startTestServer();
  const ApiKeys = load("sandbar/control/v1/api_key.proto", "sandbar.control.v1.ApiKeyService");
  apiKeys = new ApiKeys(target(), grpc.credentials.createInsecure());
});
afterAll(async () => {
  apiKeys?.close();
  await t?.stop();
});

describe("@grpc/grpc-js against the control port", () => {
  it("creates, reads, lists and deletes keys with the bearer key in metadata", async () => {
    const created = await call<ApiKey>(apiKeys, "createApiKey", { name: "grpc", permissions: ["PERMISSION_WRITE_SANDBOXES"] }, t.adminKey);
    expect(created.value).toMatch(/^sbr_[0-9a-f]{64}$/);
    expect(created.permissions).toEqual(["PERMISSION_WRITE_SANDBOXES"]);
    const current = await call<ApiKey>(apiKeys, "getCurrentApiKey", {}, created.value);
    expect(current.name).toBe("grpc");
    expect(current.value).toBe(created.value.slice(0, 3) + "*".repeat(20) + created.value.slice(-3));
    const list = await call<{ items: ApiKey[] }>(apiKeys, "listApiKeys", {}, t.adminKey);
    expect(list.items.map((k) => k.name)).toContain("grpc");
    await call(apiKeys, "deleteApiKey", { name: "grpc" }, t.adminKey);
    await expect(call(apiKeys, "getCurrentApiKey", {}, created.value)).rejects.toMatchObject({ code: grpc.status.UNAUTHENTICATED });
  });

  it("gets the REST errors as gRPC codes", async () => {
    await expect(call(apiKeys, "listApiKeys", {})).rejects.toMatchObject({ code: grpc.status.UNAUTHENTICATED, details: "Invalid credentials" });
    await expect(call(apiKeys, "getApiKey", { name: "missing" }, t.adminKey)).rejects.toMatchObject({ code: grpc.status.NOT_FOUND, details: "API key not found" });
    await expect(call(apiKeys, "createApiKey", { name: "", permissions: [] }, t.adminKey)).rejects.toMatchObject({ code: grpc.status.INVALID_ARGUMENT, details: "name should not be empty" });
    await call(apiKeys, "createApiKey", { name: "dup", permissions: [] }, t.adminKey);
    await expect(call(apiKeys, "createApiKey", { name: "dup", permissions: [] }, t.adminKey)).rejects.toMatchObject({ code: grpc.status.ALREADY_EXISTS });
    const child = await call<ApiKey>(apiKeys, "createApiKey", { name: "narrow", permissions: [] }, t.adminKey);
    await expect(call(apiKeys, "setManagedApiKeys", { organizationId: "x", enabled: true }, child.value)).rejects.toMatchObject({ code: grpc.status.PERMISSION_DENIED });
    await expect(call(apiKeys, "deleteApiKeyForUser", { userId: "u", name: "n" }, t.adminKey)).rejects.toMatchObject({ code: grpc.status.UNAUTHENTICATED });
  });

  it("answers gRPC health checks", async () => {
    const Health = load("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    const health = new Health(target(), grpc.credentials.createInsecure());
    expect(await call<{ status: string }>(health, "check", { service: "" })).toEqual({ status: "SERVING" });
    expect(await call<{ status: string }>(health, "check", { service: "sandbar.control.v1.ApiKeyService" })).toEqual({ status: "SERVING" });
    await expect(call(health, "check", { service: "nope" })).rejects.toMatchObject({ code: grpc.status.NOT_FOUND });
    health.close();
  });

  it("lists the services and serves their descriptors through reflection", async () => {
    const Reflection = load("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1.ServerReflection");
    const reflection = new Reflection(target(), grpc.credentials.createInsecure());
    const stream: grpc.ClientDuplexStream<object, ReflectionReply> = reflection.serverReflectionInfo();
    const replies: ReflectionReply[] = [];
    stream.on("data", (r: ReflectionReply) => replies.push(r));
    const ended = new Promise((resolve, reject) => {
      stream.on("end", resolve);
      stream.on("error", reject);
    });
    stream.write({ listServices: "" });
    stream.write({ fileContainingSymbol: "sandbar.control.v1.ApiKeyService" });
    stream.write({ fileContainingSymbol: "sandbar.control.v1.NoSuchThing" });
    stream.end();
    await ended;
    reflection.close();
    const names = replies[0].listServicesResponse!.service.map((s) => s.name);
    expect(names).toEqual(expect.arrayContaining(["sandbar.control.v1.ApiKeyService", "sandbar.control.v1.SandboxService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"]));
    const files: Buffer[] = replies[1].fileDescriptorResponse!.fileDescriptorProto;
    expect(files.length).toBeGreaterThan(2);
    expect(files[0].toString("latin1")).toContain("sandbar/control/v1/api_key.proto");
    expect(replies[2].errorResponse!.errorCode).toBe(5);
  });
});

describe("connect-es transports on the same port", () => {
  it.each([
    ["Connect over HTTP/1.1", () => createConnectTransport({ baseUrl: t.url, httpVersion: "1.1" })],
    ["Connect over h2c", () => createConnectTransport({ baseUrl: t.url, httpVersion: "2" })],
    ["gRPC", () => createGrpcTransport({ baseUrl: t.url })],
    ["gRPC-Web", () => createGrpcWebTransport({ baseUrl: t.url, httpVersion: "1.1" })],
  ])("%s", async (_name, transport) => {
    const client = createClient(ApiKeyService, transport());
    const current = await client.getCurrentApiKey({}, { headers: { authorization: `Bearer ${t.adminKey}` } });
    expect(current.name).toBe("sandbar-admin");
    const err = await client.getCurrentApiKey({}).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.Unauthenticated);
  });
});
