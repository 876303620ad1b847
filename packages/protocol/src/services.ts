import { readdir } from "node:fs/promises";
import type { DescFile, DescService } from "@bufbuild/protobuf";

const genRoot = new URL("../gen/", import.meta.url);

/**
 * Every generated file of a proto package directory (e.g. "sandbar/control/v1"), loaded
 * from the generated code: adding a .proto file adds its services to the server.
 */
export async function filesIn(dir: string): Promise<DescFile[]> {
  const url = new URL(dir.replace(/\/?$/, "/"), genRoot);
  const names = (await readdir(url)).filter((n) => n.endsWith("_pb.js")).sort();
  const files: DescFile[] = [];
  for (const name of names) {
    const mod = (await import(new URL(name, url).href)) as Record<string, unknown>;
    for (const value of Object.values(mod)) {
      if (typeof value === "object" && value !== null && (value as DescFile).kind === "file") files.push(value as DescFile);
    }
  }
  return files;
}

export async function servicesIn(dir: string): Promise<DescService[]> {
  return (await filesIn(dir)).flatMap((f) => f.services);
}
