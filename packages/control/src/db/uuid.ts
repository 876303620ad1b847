/** Whether `s` is a UUID: ids are looked up only when they could be one (PostgreSQL refuses a malformed uuid). */
export const isUuid = (s: string) => /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(s);
