// Its own module: the context and the session-token refresh both take it (they imported each other before).

/** Options every command accepts (commander's global options). */
export interface GlobalOptions {
  json?: boolean;
  debug?: boolean;
  profile?: string;
  apiUrl?: string;
}
