import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { sendEmpty } from "./http.ts";
import type { RestHandler } from "./routes.ts";
import { deletesDirectories } from "./sdk-version.ts";

/**
 * `DELETE …/files?path=&recursive=` → 200 empty. For the clients whose daemon deleted
 * directories whole (SDK before 0.27, which send no `recursive`), a delete is recursive.
 */
export const deleteFile: RestHandler = async ({ req, res, caller, query }) => {
  const problems: string[] = [];
  const flag = query.get("recursive");
  if (flag !== null && flag !== "true" && flag !== "false") problems.push("recursive must be a boolean value");
  const recursive = flag === "true" || (flag === null && deletesDirectories(req.headers));
  await caller.unary(FileService.method.deleteFile, { path: query.get("path") ?? "", recursive }, problems);
  sendEmpty(res, 200);
};
