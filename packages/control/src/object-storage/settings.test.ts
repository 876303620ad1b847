import { describe, expect, it } from "vitest";
import { loadObjectStorageSettings } from "./settings.ts";

describe("SANDBAR_S3_* settings", () => {
  it("defaults to the embedded store", () => {
    expect(loadObjectStorageSettings({})).toEqual({ endpoint: undefined, accessKey: undefined, secretKey: undefined, bucket: "sandbar-builds", region: "us-east-1" });
  });

  it("takes an operator's endpoint with its keys", () => {
    const env = { SANDBAR_S3_ENDPOINT: "https://minio.example.com:9000/", SANDBAR_S3_ACCESS_KEY: "a", SANDBAR_S3_SECRET_KEY: "b", SANDBAR_S3_BUCKET: "ctx", SANDBAR_S3_REGION: "eu-west-1" };
    expect(loadObjectStorageSettings(env)).toEqual({ endpoint: "https://minio.example.com:9000", accessKey: "a", secretKey: "b", bucket: "ctx", region: "eu-west-1" });
  });

  it("refuses what cannot work, naming the variable", () => {
    expect(() => loadObjectStorageSettings({ SANDBAR_S3_ENDPOINT: "minio:9000" })).toThrow(/SANDBAR_S3_ENDPOINT must be an http\(s\) URL/);
    expect(() => loadObjectStorageSettings({ SANDBAR_S3_ENDPOINT: "http://minio:9000" })).toThrow(/SANDBAR_S3_ACCESS_KEY and SANDBAR_S3_SECRET_KEY are required/);
    expect(() => loadObjectStorageSettings({ SANDBAR_S3_BUCKET: "Bad_Bucket" })).toThrow(/SANDBAR_S3_BUCKET must be an S3 bucket name/);
    expect(() => loadObjectStorageSettings({ SANDBAR_S3_REGION: "us east" })).toThrow(/SANDBAR_S3_REGION must be a region name/);
  });
});
