// The package's reviewed casts: the lint (biome.json, lint/casts.grit) refuses `any`, `as unknown as` and
// `as never` everywhere else. Each entry says why it cannot be typed.

/**
 * An answer's JSON body as the test clients hand it over: tests read the fields they expect of
 * each route, and a declared type per route would repeat the contract's messages in JSON spelling.
 */
export type UntypedJson = any;
