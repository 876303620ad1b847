/** A validated API key, as held in the credential cache. */
export interface KeyIdentity {
  id: string;
  hash: string;
  name: string;
  organizationId: string;
  userId: string;
  permissions: ReadonlySet<string>;
  expiresAt: Date | null;
  prefix: string;
  suffix: string;
  createdAt: Date;
  /** Kept current in memory by the credential cache (written to the database at most every 10 s). */
  lastUsedAt: Date | null;
}

/** Who is calling: resolved from the credentials of a request. */
export interface Principal {
  kind: "api-key" | "jwt";
  userId: string;
  email: string;
  /** System role: "admin" may call operator routes. */
  systemRole: string;
  apiKey?: KeyIdentity;
}

/** What a handler knows about its caller once the guard let the call through. */
export interface AuthContext {
  principal?: Principal;
  organizationId?: string;
  memberRole?: string;
  /** The scopes the call holds: the key's, or a signed-in member's (every scope for an owner). */
  permissions?: ReadonlySet<string>;
}
