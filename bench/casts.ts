// The benchmarks' reviewed casts: the lint (biome.json, lint/casts.grit) refuses `any`, `as unknown as` and
// `as never` everywhere else. Each entry says why it cannot be typed.

/**
 * A REST answer's JSON body as the bench clients hand it over: a bench reads the few fields it
 * needs of each route, and a declared type per route would repeat the contract in JSON spelling.
 */
export type UntypedJson = any;
