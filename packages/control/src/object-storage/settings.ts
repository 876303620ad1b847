// Where build contexts are stored (SANDBAR_S3_*): an S3-compatible endpoint the operator names, or
// (unset) the embedded s3rver the server starts in its data dir.

export interface ObjectStorageSettings {
  /** http(s) URL of an S3-compatible service; unset: the embedded store. */
  endpoint?: string;
  accessKey?: string;
  secretKey?: string;
  bucket: string;
  region: string;
}

const BUCKET = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/;

export function loadObjectStorageSettings(env: NodeJS.ProcessEnv): ObjectStorageSettings {
  const endpoint = env.SANDBAR_S3_ENDPOINT?.trim() || undefined;
  if (endpoint !== undefined && (!URL.canParse(endpoint) || !/^https?:$/.test(new URL(endpoint).protocol))) {
    throw new Error(`SANDBAR_S3_ENDPOINT must be an http(s) URL, got "${endpoint}"`);
  }
  const accessKey = env.SANDBAR_S3_ACCESS_KEY || undefined;
  const secretKey = env.SANDBAR_S3_SECRET_KEY || undefined;
  if (endpoint !== undefined && (accessKey === undefined || secretKey === undefined)) {
    throw new Error("SANDBAR_S3_ACCESS_KEY and SANDBAR_S3_SECRET_KEY are required with SANDBAR_S3_ENDPOINT");
  }
  const bucket = env.SANDBAR_S3_BUCKET?.trim() || "sandbar-builds";
  if (!BUCKET.test(bucket) || bucket.includes("..")) throw new Error(`SANDBAR_S3_BUCKET must be an S3 bucket name (3-63 lower-case letters, digits, dots, dashes), got "${bucket}"`);
  const region = env.SANDBAR_S3_REGION?.trim() || "us-east-1";
  if (!/^[a-z0-9-]{1,40}$/.test(region)) throw new Error(`SANDBAR_S3_REGION must be a region name (us-east-1), got "${region}"`);
  return { endpoint: endpoint?.replace(/\/+$/, ""), accessKey, secretKey, bucket, region };
}
