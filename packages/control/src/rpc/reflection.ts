import { createRegistry, type DescFile, toBinary } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import type { ServerReflection, ServerReflectionRequest } from "@sandbar/protocol/gen/grpc/reflection/v1/reflection_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ServerReflectionResponseSchema } from "@sandbar/protocol/gen/grpc/reflection/v1/reflection_pb.js";

type Reply = MessageInitShape<typeof ServerReflectionResponseSchema>;

/**
 * grpc.reflection.v1, so grpcurl-style tools can list and call the services. Files are
 * answered with their transitive dependencies, as the protocol allows.
 */
export function reflectionService(files: DescFile[], serviceNames: string[]): ServiceImpl<typeof ServerReflection> {
  const registry = createRegistry(...files);
  const byName = new Map<string, DescFile>();
  const index = (f: DescFile) => {
    if (byName.has(f.proto.name)) return;
    byName.set(f.proto.name, f);
    f.dependencies.forEach(index);
  };
  files.forEach(index);
  const withDeps = (file: DescFile): Uint8Array[] => {
    const seen = new Set<string>();
    const out: Uint8Array[] = [];
    const visit = (f: DescFile) => {
      if (seen.has(f.name)) return;
      seen.add(f.name);
      out.push(toBinary(FileDescriptorProtoSchema, f.proto));
      f.dependencies.forEach(visit);
    };
    visit(file);
    return out;
  };
  const answer = (req: ServerReflectionRequest): Reply => {
    const r = req.messageRequest;
    const notFound = (what: string): Reply => ({ messageResponse: { case: "errorResponse", value: { errorCode: 5, errorMessage: `${what} not found` } } });
    const files = (f: DescFile | undefined, what: string): Reply =>
      f ? { messageResponse: { case: "fileDescriptorResponse", value: { fileDescriptorProto: withDeps(f) } } } : notFound(what);
    switch (r.case) {
      case "listServices":
        return { messageResponse: { case: "listServicesResponse", value: { service: serviceNames.map((name) => ({ name })) } } };
      case "fileByFilename":
        return files(byName.get(r.value), r.value);
      case "fileContainingSymbol": {
        const symbol = r.value.replace(/^\./, "");
        const desc = registry.get(symbol) ?? registry.get(symbol.slice(0, symbol.lastIndexOf(".")));
        const file = desc?.file;
        return files(file, symbol);
      }
      case "fileContainingExtension": {
        const message = registry.getMessage(r.value.containingType);
        const ext = message && registry.getExtensionFor(message, r.value.extensionNumber);
        return files(ext?.file, `extension ${r.value.extensionNumber} of ${r.value.containingType}`);
      }
      case "allExtensionNumbersOfType": {
        const msg = registry.getMessage(r.value);
        if (!msg) return notFound(r.value);
        const numbers = [...registry].filter((d) => d.kind === "extension" && d.extendee.typeName === msg.typeName).map((d) => (d.kind === "extension" ? d.number : 0));
        return { messageResponse: { case: "allExtensionNumbersResponse", value: { baseTypeName: msg.typeName, extensionNumber: numbers } } };
      }
      default:
        return { messageResponse: { case: "errorResponse", value: { errorCode: 3, errorMessage: "unsupported reflection request" } } };
    }
  };
  return {
    async *serverReflectionInfo(requests) {
      for await (const req of requests) yield { ...answer(req), validHost: req.host, originalRequest: req } as Reply;
    },
  };
}
