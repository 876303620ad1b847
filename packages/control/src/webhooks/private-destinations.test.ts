import { describe, expect, it } from "vitest";
import { api } from "../testing/server.ts";
import { isInternalAddress } from "./destinations.ts";
import { hostAddresses, inUrl } from "./testing/host-addresses.ts";
import { base, webhookSuite } from "./testing/suite.ts";

// Destinations on a server that refuses private ones (the other webhook suites allow them, to
// deliver to receivers on 127.0.0.1).

const w = webhookSuite({ allowPrivate: false });

describe("webhook destinations on a server that refuses private ones", () => {
  it("refuses internal addresses on create and update, and at delivery", async () => {
    const r = await w.receiver();
    const org = await w.adminOrg();
    for (const url of [r.url, "http://localhost:9/x", "http://[::1]/x", "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://192.168.0.10/", "http://[fe80::1]/"]) {
      const res = await api(w.t.url, w.t.adminKey, "POST", base(org), { url });
      expect(res.status, url).toBe(400);
      expect(res.body.message, url).toMatch(/^url must not point at an internal address .*SANDBAR_WEBHOOK_ALLOW_PRIVATE=true/);
    }
    const made = await api(w.t.url, w.t.adminKey, "POST", base(org), { url: "https://hooks.example.com/x" });
    expect(made.status).toBe(201);
    const id = made.body.endpoint.id as string;
    expect((await api(w.t.url, w.t.adminKey, "PATCH", `${base(org)}/${id}`, { url: r.url })).status).toBe(400);

    // A destination that turned internal after it was checked (as a DNS name can) is refused
    // when delivering: the row is changed behind the API's back to stand for that.
    await w.db.query(`update webhook_endpoint set url = $1 where id = $2`, [r.url, id]);
    await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${id}/test`);
    const attempts = await w.attemptsOf(org, id, 1);
    expect(attempts[0]).toMatchObject({ success: false, error: "destination 127.0.0.1 is an internal address" });
    expect(r.got).toEqual([]);
  });

  it("refuses this host's own addresses (every interface's) and IPv6 forms carrying an internal IPv4, on create and update", async () => {
    const org = await w.adminOrg();
    const made = await api(w.t.url, w.t.adminKey, "POST", base(org), { url: "https://hooks.example.com/x" });
    expect(made.status).toBe(201);
    const id = made.body.endpoint.id as string;
    const own = hostAddresses();
    expect(own.length, "this test needs an interface besides loopback").toBeGreaterThan(0);
    for (const a of own) {
      const url = `http://${inUrl(a)}:8080/hook`;
      const why = isInternalAddress(a) ? "an internal address" : "an address of this server";
      for (const res of [await api(w.t.url, w.t.adminKey, "POST", base(org), { url }), await api(w.t.url, w.t.adminKey, "PATCH", `${base(org)}/${id}`, { url })]) {
        expect(res.status, url).toBe(400);
        expect(res.body.message, url).toMatch(new RegExp(`^url must not point at ${why} \\(.*\\); set SANDBAR_WEBHOOK_ALLOW_PRIVATE=true`));
      }
    }
    for (const url of ["http://[::127.0.0.1]/", "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/", "http://[0:0:0:0:0:ffff:10.0.0.1]/", "http://[64:ff9b::10.0.0.1]/", "http://[2002:a00:1::1]/", "http://2130706433/", "http://0x7f.1/"]) {
      const res = await api(w.t.url, w.t.adminKey, "PATCH", `${base(org)}/${id}`, { url });
      expect(res.status, url).toBe(400);
      expect(res.body.message, url).toMatch(/^url must not point at an internal address \(.*\); set SANDBAR_WEBHOOK_ALLOW_PRIVATE=true/);
    }
    expect((await api(w.t.url, w.t.adminKey, "GET", `${base(org)}/${id}`)).body.url).toBe("https://hooks.example.com/x");
    await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${id}`);
  });

  // An address of this host outside the private ranges (a public address on eth0): only the
  // own-address rule refuses it. Hosts without one have nothing for this case to show.
  const publicOwn = hostAddresses().find((a) => !isInternalAddress(a));
  it.skipIf(!publicOwn)("refuses at delivery an address of this host outside the private ranges, reading no answer from it", async () => {
    const r = await w.receiver(publicOwn);
    const org = await w.adminOrg();
    const made = await api(w.t.url, w.t.adminKey, "POST", base(org), { url: "https://hooks.example.com/x" });
    const id = made.body.endpoint.id as string;
    // The row is pointed at the host's address behind the API's back: a destination that changed after its check.
    await w.db.query(`update webhook_endpoint set url = $1 where id = $2`, [r.url, id]);
    await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${id}/test`);
    const [attempt] = await w.attemptsOf(org, id, 1);
    expect(attempt).toMatchObject({ success: false, statusCode: null, error: `destination ${publicOwn} is an address of this server` });
    expect(attempt!.responseBody ?? undefined).toBeUndefined();
    expect(r.got).toEqual([]);
    await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${id}`);
  });
});
