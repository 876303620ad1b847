import { access, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { errors } from "@sandbar/protocol";
import { run, which } from "./command.ts";
import type { NetworkMode } from "../provider.ts";

// Egress for sandboxes that ask for it (DESIGN.md decision 14): a network namespace per sandbox,
// wired to the host by a veth pair on a /30 of the sandbox subnet, masqueraded on the way out.
// The policy lives in the HOST namespace, in one nftables table of ours, where nothing inside the
// sandbox can reach it (the sandbox has no capability over a namespace owned by the host's user
// namespace). Sandboxes with mode "none" get none of this: bubblewrap's own loopback-only netns
// (given a veth later if their policy changes while they run: see attach).
//
//   table inet <table>
//     map egress: host veth name -> jump <the sandbox's chain>
//     input:       anything arriving from a sandbox veth is dropped (every host address, the
//                  gateway, the control port, PostgreSQL; the host's loopback is martian anyway)
//     forward:     replies to a sandbox pass; nothing else enters a sandbox (no sandbox reaches
//                  another); a sandbox's packets go through its chain, and what it does not accept
//                  is dropped
//     postrouting: masquerade what leaves from a sandbox veth
//
// The static part is rewritten in one transaction by every runner that starts (idempotent: the
// map's elements and the per-sandbox chains survive it).

const DEFAULT_SUBNET = "10.213.0.0/16";
const DEFAULT_TABLE = "sandbar";
/** Host-side veth names: <prefix><slot>; the sandbox side is always eth0. */
const HOST_IF_PREFIX = "sbh";

/** Destinations refused whatever the allow list says (besides the host's own addresses, see input). */
const ALWAYS_REFUSED = [
  "0.0.0.0/8", // "this network"
  "127.0.0.0/8", // the host's loopback (already martian from a veth; refused here too)
  "169.254.0.0/16", // link-local: cloud metadata services
  "224.0.0.0/3", // multicast, reserved, broadcast
];

export interface NetworkPolicy {
  /** "none" here: a running sandbox whose egress was withdrawn (everything dropped, DNS too). */
  mode: NetworkMode;
  /** IPv4 CIDRs the sandbox may reach, for mode "allow-list". */
  allowCidrs?: string[];
}

/** What of a sandbox's network a teardown can find on the host. */
export type NetworkPart = "nftables chain" | "veth" | "network namespace";

/** Where a sandbox's network lives; written to its runtime dir so a restarted runner can undo it. */
export interface NetworkLease {
  slot: number;
  /** Name of the namespace (under /run/netns); empty when the veth was added to a running sandbox's own. */
  netns: string;
  hostIf: string;
  /** Sandbox side and gateway (host side) addresses. */
  address: string;
  gateway: string;
}

export interface NetworkOptions {
  /** IPv4 range sandboxes get their /30s from (SANDBAR_SANDBOX_SUBNET). */
  subnet?: string;
  /** nftables table name (family inet). */
  table?: string;
  /** Resolvers written to the sandbox's resolv.conf; default the host's non-loopback ones. */
  dnsServers?: string[];
  /** Prefix of the network namespace names (runners sharing a host pass their own). */
  netnsPrefix?: string;
}

/** a.b.c.d/n with n 0..32 and each octet 0..255; throws otherwise. */
function parseCidr(cidr: string): { base: number; bits: number } {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\/(\d{1,2})$/.exec(cidr.trim());
  if (!m) throw errors.invalidArgument(`invalid IPv4 CIDR ${JSON.stringify(cidr)}: expected a.b.c.d/n`);
  const octets = m.slice(1, 5).map(Number);
  const bits = Number(m[5]);
  if (octets.some((o) => o > 255) || bits > 32) throw errors.invalidArgument(`invalid IPv4 CIDR ${JSON.stringify(cidr)}`);
  const ip = ((octets[0] << 24) | (octets[1] << 16) | (octets[2] << 8) | octets[3]) >>> 0;
  const mask = bits === 0 ? 0 : (0xffffffff << (32 - bits)) >>> 0;
  return { base: (ip & mask) >>> 0, bits };
}

function ipString(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join(".");
}

/** The host's resolvers a sandbox can use: IPv4, not loopback (a stub on 127.0.0.53 is the host's). */
async function hostResolvers(): Promise<string[]> {
  for (const file of ["/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"]) {
    const text = await readFile(file, "utf8").catch(() => "");
    const servers = [...text.matchAll(/^\s*nameserver\s+(\d+\.\d+\.\d+\.\d+)\s*$/gm)].map((m) => m[1]).filter((ip) => !ip.startsWith("127."));
    if (servers.length > 0) return servers.slice(0, 3);
  }
  return [];
}

async function nft(script: string): Promise<void> {
  await run("nft", ["-f", "-"], { input: script });
}

async function ip(...args: string[]): Promise<string> {
  return (await run("ip", args)).stdout;
}

export class SandboxNetworks {
  readonly #subnet: { base: number; bits: number };
  readonly #table: string;
  readonly #netnsPrefix: string;
  readonly #dns: string[];
  /** Slots leased by this runner (others on the host are found by `ip link add` failing). */
  readonly #used = new Set<number>();
  #ready?: Promise<void>;

  private constructor(subnet: { base: number; bits: number }, table: string, netnsPrefix: string, dns: string[]) {
    this.#subnet = subnet;
    this.#table = table;
    this.#netnsPrefix = netnsPrefix;
    this.#dns = dns;
  }

  static async create(options: NetworkOptions = {}): Promise<SandboxNetworks> {
    const subnet = parseCidr(options.subnet ?? DEFAULT_SUBNET);
    if (subnet.bits > 24) throw errors.invalidArgument(`sandbox subnet ${options.subnet} is too small: at least a /24`);
    const table = options.table ?? DEFAULT_TABLE;
    if (!/^[a-z][a-z0-9_]{0,30}$/.test(table)) throw errors.invalidArgument(`invalid nftables table name ${JSON.stringify(table)}`);
    return new SandboxNetworks(subnet, table, options.netnsPrefix ?? "sandbar-", options.dnsServers ?? (await hostResolvers()));
  }

  get dnsServers(): readonly string[] {
    return this.#dns;
  }

  get subnet(): string {
    return `${ipString(this.#subnet.base)}/${this.#subnet.bits}`;
  }

  /** The resolv.conf a sandbox with egress gets. */
  resolvConf(): string {
    return this.#dns.length > 0 ? this.#dns.map((s) => `nameserver ${s}\n`).join("") : "# no resolver usable from sandboxes on this host\n";
  }

  /** Forwarding on, the table and its static chains (once per runner, idempotent). */
  #ensureBase(): Promise<void> {
    this.#ready ??= (async () => {
      if (!which("nft")) throw errors.failedPrecondition("nftables is not installed (apt-get install nftables): sandboxes with network access need it");
      await writeFile("/proc/sys/net/ipv4/ip_forward", "1");
      const t = `inet ${this.#table}`;
      await nft(`
add table ${t}
add map ${t} egress { type ifname : verdict; }
add chain ${t} input { type filter hook input priority filter - 10; policy accept; }
flush chain ${t} input
add rule ${t} input iifname "${HOST_IF_PREFIX}*" drop
add chain ${t} forward { type filter hook forward priority filter - 10; policy accept; }
flush chain ${t} forward
add rule ${t} forward oifname "${HOST_IF_PREFIX}*" ct state established,related accept
add rule ${t} forward oifname "${HOST_IF_PREFIX}*" drop
add rule ${t} forward iifname vmap @egress
add rule ${t} forward iifname "${HOST_IF_PREFIX}*" drop
add chain ${t} postrouting { type nat hook postrouting priority srcnat; policy accept; }
flush chain ${t} postrouting
add rule ${t} postrouting iifname "${HOST_IF_PREFIX}*" masquerade
`);
    })().catch((err: unknown) => {
      this.#ready = undefined;
      throw err;
    });
    return this.#ready;
  }

  #slotCount(): number {
    return Math.min(2 ** (32 - this.#subnet.bits) / 4, 100_000);
  }

  /**
   * Creates the sandbox's namespace and veth pair and installs its policy. The namespace is named
   * after the sandbox: bubblewrap is started inside it (see launcher.ts).
   */
  async setUp(id: string, policy: NetworkPolicy): Promise<NetworkLease> {
    await this.#ensureBase();
    const netns = this.netnsName(id);
    await this.#removeNetns(netns);
    await ip("netns", "add", netns);
    try {
      const lease = await this.#wire({ netns });
      await this.applyPolicy(lease, policy);
      return lease;
    } catch (err) {
      await this.#removeNetns(netns).catch(() => undefined);
      throw err;
    }
  }

  netnsName(id: string): string {
    return `${this.#netnsPrefix}${id}`;
  }

  /**
   * Egress for a sandbox running loopback-only: the veth goes into the namespace bubblewrap made,
   * the one its init (`pid`, on the host) is in. Owned by the sandbox's user namespace, in which it
   * holds no capability (all dropped, no new user namespaces), so it can change nothing there either.
   */
  async attach(pid: number, nsenter: string, policy: NetworkPolicy): Promise<NetworkLease> {
    await this.#ensureBase();
    const lease = await this.#wire({ pid, nsenter });
    try {
      await this.applyPolicy(lease, policy);
      return lease;
    } catch (err) {
      await this.#unwire(lease).catch(() => undefined);
      throw err;
    }
  }

  /** A free slot's veth pair, its addresses and routes, into a named namespace or a process's. */
  async #wire(target: { netns: string } | { pid: number; nsenter: string }): Promise<NetworkLease> {
    const netns = "netns" in target ? target.netns : "";
    // One `ip -batch` per side: each process spawned costs milliseconds on a busy host.
    const inNs = (script: string) =>
      "netns" in target ? run("ip", ["-n", target.netns, "-batch", "-"], { input: script }) : run(target.nsenter, [`--net=/proc/${target.pid}/ns/net`, "--", "ip", "-batch", "-"], { input: script });
    const peerNs = "netns" in target ? target.netns : String(target.pid);
    for (let slot = 0; slot < this.#slotCount(); slot++) {
      if (this.#used.has(slot)) continue;
      const hostIf = `${HOST_IF_PREFIX}${slot}`;
      this.#used.add(slot);
      try {
        await ip("link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", peerNs);
      } catch (err) {
        if (/exists/i.test((err as Error).message)) continue; // another runner's; stays marked used here
        this.#used.delete(slot);
        throw err;
      }
      const net = this.#subnet.base + slot * 4;
      const lease: NetworkLease = { slot, netns, hostIf, gateway: ipString(net + 1), address: ipString(net + 2) };
      try {
        await writeFile(`/proc/sys/net/ipv6/conf/${hostIf}/disable_ipv6`, "1").catch(() => undefined);
        await run("ip", ["-batch", "-"], { input: `addr add ${lease.gateway}/30 dev ${hostIf}\nlink set ${hostIf} up\n` });
        await inNs(`link set lo up\naddr add ${lease.address}/30 dev eth0\nlink set eth0 up\nroute add default via ${lease.gateway}\n`);
        return lease;
      } catch (err) {
        await this.#unwire(lease).catch(() => undefined);
        throw err;
      }
    }
    throw errors.resourceExhausted(`no free address left in the sandbox subnet ${this.subnet}`);
  }

  /** Replaces the sandbox's policy in one transaction (takes effect at once, for new and open flows alike). */
  async applyPolicy(lease: NetworkLease, policy: NetworkPolicy): Promise<void> {
    const t = `inet ${this.#table}`;
    const chain = `s${lease.slot}`;
    const lines = [
      `add chain ${t} ${chain}`,
      `flush chain ${t} ${chain}`,
      `add rule ${t} ${chain} meta nfproto != ipv4 drop`,
    ];
    if (this.#dns.length > 0 && policy.mode !== "none") {
      for (const proto of ["udp", "tcp"]) lines.push(`add rule ${t} ${chain} ip daddr { ${this.#dns.join(", ")} } ${proto} dport 53 accept`);
    }
    lines.push(`add rule ${t} ${chain} ip daddr { ${[...ALWAYS_REFUSED, this.subnet].join(", ")} } drop`);
    if (policy.mode === "full") {
      lines.push(`add rule ${t} ${chain} accept`);
    } else if (policy.mode === "allow-list") {
      const cidrs = (policy.allowCidrs ?? []).map((c) => {
        const { base, bits } = parseCidr(c);
        return `${ipString(base)}/${bits}`;
      });
      if (cidrs.length > 0) lines.push(`add rule ${t} ${chain} ip daddr { ${cidrs.join(", ")} } accept`);
    }
    // What the chain does not accept is dropped by the forward chain after the map.
    lines.push(`add element ${t} egress { "${lease.hostIf}" : jump ${chain} }`);
    await nft(lines.join("\n") + "\n");
  }

  /** Removes the sandbox's rules, veth pair and namespace. Idempotent. */
  async tearDown(lease: NetworkLease | undefined, id: string): Promise<void> {
    // An attached veth goes with its namespace when the sandbox's processes end; named ones stay until removed.
    if (lease) await this.#unwire(lease);
    await this.#removeNetns(this.netnsName(id));
  }

  /**
   * tearDown for a sandbox an earlier run left (its processes already ended), telling `found`
   * each part that was there. The lease may be stale: its veth gone long ago and the slot taken
   * by another runner on this host, whose chain has the same name. So the namespace goes first,
   * taking the veth whose other end is in it; a veth still there after that is not this sandbox's
   * and its slot's chain is left alone. The table's base chains stay: every runner shares them.
   */
  async removeLeftover(lease: NetworkLease | undefined, id: string, found: (kind: NetworkPart) => void): Promise<void> {
    const netns = this.netnsName(id);
    const veth = lease && `/sys/class/net/${lease.hostIf}`;
    const hadVeth = veth !== undefined && (await exists(veth));
    if (await exists(`/run/netns/${netns}`)) {
      await this.#removeNetns(netns);
      found("network namespace");
    }
    if (!lease || !veth) return;
    // The kernel dismantles a namespace in the background: its veth goes a moment later.
    for (const deadline = Date.now() + 2000; hadVeth && (await exists(veth)) && Date.now() < deadline; ) await new Promise((r) => setTimeout(r, 20));
    if (await exists(veth)) throw new Error(`${lease.hostIf} outlived the namespace of sandbox ${id}: another runner's now; its nftables chain s${lease.slot} is left alone`);
    if (hadVeth) found("veth");
    if (await this.#hasChain(lease.slot)) found("nftables chain");
    await this.#unwire(lease);
  }

  async #hasChain(slot: number): Promise<boolean> {
    return run("nft", ["list", "chain", "inet", this.#table, `s${slot}`]).then(() => true, () => false);
  }

  /** Ids of the sandboxes whose named namespace (this runner's prefix) is on the host. */
  async namespaced(): Promise<string[]> {
    const names = await readdir("/run/netns").catch(() => [] as string[]);
    return names.filter((n) => n.startsWith(this.#netnsPrefix)).map((n) => n.slice(this.#netnsPrefix.length));
  }

  async #unwire(lease: NetworkLease): Promise<void> {
    const t = `inet ${this.#table}`;
    const chain = `s${lease.slot}`;
    // add-then-delete: one transaction that succeeds whether or not they exist.
    await nft(`add chain ${t} ${chain}
add element ${t} egress { "${lease.hostIf}" : jump ${chain} }
delete element ${t} egress { "${lease.hostIf}" }
delete chain ${t} ${chain}
`).catch((err: unknown) => {
      if (!/No such file|does not exist/i.test((err as Error).message)) throw err;
    });
    await ip("link", "del", lease.hostIf).catch(() => undefined); // also goes with the namespace
    this.#used.delete(lease.slot);
  }

  async #removeNetns(netns: string): Promise<void> {
    // Most sandboxes never had one: no `ip` process for them (it is a few ms of every start and stop).
    if (!(await exists(`/run/netns/${netns}`))) return;
    await ip("netns", "del", netns).catch(() => undefined);
    await rm(`/run/netns/${netns}`, { force: true });
  }

  /** Marks a lease found on disk as used (a runner restarting with sandboxes running). */
  markUsed(lease: NetworkLease): void {
    this.#used.add(lease.slot);
  }
}

function exists(p: string): Promise<boolean> {
  return access(p).then(
    () => true,
    () => false,
  );
}
