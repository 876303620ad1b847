import { Code, ConnectError, errors } from "@sandbar/protocol";
import { afterEach, describe, expect, it, vi } from "vitest";
import { reportUnexpected } from "./unexpected.ts";

describe("reportUnexpected", () => {
  const logged = vi.spyOn(console, "error").mockImplementation(() => undefined);
  afterEach(() => logged.mockClear());

  it("logs a failure that is not a ConnectError once, however many layers report it", () => {
    const err = new TypeError("Headers constructor: invalid key");
    const e = reportUnexpected("sandbar.control.v1.ConfigService/GetConfig", err);
    expect(e).toMatchObject({ code: Code.Internal, rawMessage: "An unexpected error occurred." });
    expect(reportUnexpected("/api/config", e)).toBe(e);
    expect(reportUnexpected("/api/config", err).code).toBe(Code.Internal);
    expect(logged.mock.calls).toEqual([["sandbar.control.v1.ConfigService/GetConfig failed:", err]]);
  });

  it("logs a ConnectError that answers 500, and no error meant for the caller", () => {
    reportUnexpected("/api/x", errors.notFound("Sandbox not found"));
    reportUnexpected("/api/x", new ConnectError("the client went away", Code.Canceled));
    expect(logged).not.toHaveBeenCalled();
    const internal = errors.internal("the agent answered a download without the file's info");
    reportUnexpected("/api/x", internal);
    reportUnexpected("/api/x", internal);
    expect(logged).toHaveBeenCalledTimes(1);
  });
});
