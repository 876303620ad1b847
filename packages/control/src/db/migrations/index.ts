import { Migration0001Identity } from "./0001-identity.ts";

/** Every migration, in order. Applied at start; never edit one that has shipped, add the next. */
export const migrations = [{ name: "0001-identity", class: Migration0001Identity }];
