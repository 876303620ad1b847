import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { ListValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { WebhookService } from "@sandbar/protocol/gen/sandbar/control/v1/webhook_pb.js";
import { describe, expect, it } from "vitest";
import { api } from "../testing/server.ts";
import { base, webhookSuite } from "./testing/suite.ts";

// Webhook endpoints as callers manage them, over REST and gRPC: no delivery here.

const w = webhookSuite();

describe("webhook endpoints", () => {
  it("are made, read, changed, rotated and deleted; the secret is answered once and stored sealed", async () => {
    const org = await w.adminOrg();
    const made = await w.endpoint(org, "https://hooks.example.com/a", { description: "ci", eventTypes: ["sandbox.created", "sandbox.state.updated", "sandbox.created"] });
    expect(made.secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    expect(made.endpoint).toMatchObject({ url: "https://hooks.example.com/a", description: "ci", eventTypes: ["sandbox.created", "sandbox.state.updated"], enabled: true, organizationId: org });
    const id = made.endpoint.id;

    const [stored] = (await w.db.query(`select secret from webhook_endpoint where id = $1`, [id])).rows;
    expect(stored.secret).toMatch(/^v1:/);
    expect(stored.secret).not.toContain(made.secret.slice(6, 20));

    const got = await api(w.t.url, w.t.adminKey, "GET", `${base(org)}/${id}`);
    expect(got.status).toBe(200);
    expect(got.body).toEqual(made.endpoint);
    expect(JSON.stringify(got.body)).not.toContain("whsec_");
    const list = await api(w.t.url, w.t.adminKey, "GET", base(org));
    expect(list.body.map((e: { id: string }) => e.id)).toContain(id);
    expect(JSON.stringify(list.body)).not.toContain("whsec_");

    const changed = await api(w.t.url, w.t.adminKey, "PATCH", `${base(org)}/${id}`, { url: "https://hooks.example.com/b", eventTypes: [], enabled: false });
    expect(changed.status, JSON.stringify(changed.body)).toBe(200);
    expect(changed.body).toMatchObject({ url: "https://hooks.example.com/b", description: "ci", eventTypes: [], enabled: false });
    // Absent fields stay as they are.
    expect((await api(w.t.url, w.t.adminKey, "PATCH", `${base(org)}/${id}`, { description: "nightly" })).body).toMatchObject({ url: "https://hooks.example.com/b", description: "nightly", enabled: false });

    const rotated = await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${id}/rotate-secret`);
    expect(rotated.status).toBe(200);
    expect(rotated.body.secret).toMatch(/^whsec_/);
    expect(rotated.body.secret).not.toBe(made.secret);

    expect((await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${id}`)).status).toBe(204);
    expect((await api(w.t.url, w.t.adminKey, "GET", `${base(org)}/${id}`)).body).toMatchObject({ statusCode: 404, message: `Webhook endpoint with ID ${id} not found` });
    expect((await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${id}`)).status).toBe(404);
  });

  it("refuse bad input with a 400 naming the field, and unknown ids with a 404", async () => {
    const org = await w.adminOrg();
    const bad = async (verb: string, path: string, body: unknown) => {
      const res = await api(w.t.url, w.t.adminKey, verb, path, body);
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      return res.body.message as string;
    };
    expect(await bad("POST", base(org), { url: "not a url" })).toBe("url must be a valid URL");
    expect(await bad("POST", base(org), { url: "" })).toBe("url must be a valid URL");
    expect(await bad("POST", base(org), { url: "file:///etc/passwd" })).toBe("url must use http or https");
    expect(await bad("POST", base(org), { url: "https://a:b@hooks.example.com/" })).toBe("url must not contain a user name or password");
    expect(await bad("POST", base(org), { url: "https://hooks.example.com/", eventTypes: ["sandbox.exploded"] })).toMatch(/^eventTypes must each be one of the following values: sandbox.created, .* \(got "sandbox.exploded"\)$/);
    expect(await bad("POST", base(org), { url: "https://hooks.example.com/", description: "x".repeat(1025) })).toBe("description must be shorter than or equal to 1024 characters");
    expect(await bad("POST", base(org), { url: "https://hooks.example.com/", enabled: "yes" })).toMatch(/enabled/);
    const { endpoint: e } = await w.endpoint(org, "https://hooks.example.com/c");
    expect(await bad("PATCH", `${base(org)}/${e.id}`, { eventTypes: [1] })).toBe("eventTypes must be an array of strings");
    expect(await bad("PATCH", `${base(org)}/${e.id}`, { url: "gopher://x" })).toBe("url must use http or https");
    expect(await bad("GET", `${base(org)}/${e.id}/attempts?page=0`, undefined)).toBe("page must be a positive integer");
    expect(await bad("GET", `${base(org)}/${e.id}/attempts?limit=500`, undefined)).toBe("limit must be an integer from 1 to 200");
    await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${e.id}`);
    for (const id of ["nope", randomUUID()]) {
      for (const [verb, suffix] of [["GET", ""], ["PATCH", ""], ["DELETE", ""], ["POST", "/rotate-secret"], ["POST", "/test"], ["GET", "/attempts"]] as const) {
        const res = await api(w.t.url, w.t.adminKey, verb, `${base(org)}/${id}${suffix}`, verb === "PATCH" ? {} : undefined);
        expect(res.status, `${verb} ${suffix} ${id}`).toBe(404);
      }
    }
  });

  it("are changed by owners only; members read them", async () => {
    const [olga, mo] = [await w.jwt("olga"), await w.jwt("mo")];
    const org = (await api(w.t.url, olga, "POST", "/organizations", { name: "olga's team", defaultRegionId: "local" })).body.id as string;
    await api(w.t.url, mo, "GET", "/organizations");
    const inv = await api(w.t.url, olga, "POST", `/organizations/${org}/invitations`, { email: "mo@example.test", role: "member" });
    expect((await api(w.t.url, mo, "POST", `/organizations/invitations/${inv.body.id}/accept`)).status).toBe(200);
    const { endpoint: e } = await w.endpoint(org, "https://hooks.example.com/olga", {}, olga);
    expect((await api(w.t.url, mo, "GET", base(org))).body.map((x: { id: string }) => x.id)).toEqual([e.id]);
    expect((await api(w.t.url, mo, "GET", `${base(org)}/${e.id}/attempts`)).status).toBe(200);
    for (const [verb, path, body] of [
      ["POST", base(org), { url: "https://hooks.example.com/mo" }],
      ["PATCH", `${base(org)}/${e.id}`, { enabled: false }],
      ["DELETE", `${base(org)}/${e.id}`, undefined],
      ["POST", `${base(org)}/${e.id}/rotate-secret`, undefined],
      ["POST", `${base(org)}/${e.id}/test`, undefined],
    ] as const) {
      expect((await api(w.t.url, mo, verb, path, body)).body, `${verb} ${path}`).toMatchObject({ statusCode: 403, message: "Access denied" });
    }
  });
});

describe("webhook endpoints over gRPC", () => {
  it("take the same calls and rules as REST", async () => {
    const client = createClient(
      WebhookService,
      createGrpcTransport({ baseUrl: w.t.url, interceptors: [(next) => (req) => (req.header.set("authorization", `Bearer ${w.t.adminKey}`), next(req))] }),
    );
    const organizationId = await w.adminOrg();
    const made = await client.createWebhookEndpoint({ organizationId, url: "https://hooks.example.com/grpc", eventTypes: ["sandbox.created"] });
    expect(made.secret).toMatch(/^whsec_/);
    const list = (types: string[]) => create(ListValueSchema, { values: types.map((v) => ({ kind: { case: "stringValue" as const, value: v } })) });
    const changed = await client.updateWebhookEndpoint({ organizationId, endpointId: made.endpoint!.id, eventTypes: list(["sandbox.state.updated", "organization.member.added"]) });
    expect(changed.eventTypes).toEqual(["sandbox.state.updated", "organization.member.added"]);
    const refused = await client.updateWebhookEndpoint({ organizationId, endpointId: made.endpoint!.id, eventTypes: list(["nope"]) }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(ConnectError);
    expect((refused as ConnectError).code).toBe(Code.InvalidArgument);
    const missing = await client.getWebhookEndpoint({ organizationId, endpointId: randomUUID() }).catch((e: unknown) => e);
    expect((missing as ConnectError).code).toBe(Code.NotFound);
    await client.deleteWebhookEndpoint({ organizationId, endpointId: made.endpoint!.id });
  });
});
