import { InvalidArgumentError } from "commander";

/** Commander option parsers: a bad value is a usage error naming the option. */
export function positiveInt(name: string) {
  return (value: string): number => {
    const n = Number(value);
    if (!/^\d+$/.test(value.trim()) || !Number.isSafeInteger(n) || n <= 0) throw new InvalidArgumentError(`${name} must be a positive whole number, got "${value}".`);
    return n;
  };
}

export function nonNegativeInt(name: string) {
  return (value: string): number => {
    const n = Number(value);
    if (!/^\d+$/.test(value.trim()) || !Number.isSafeInteger(n)) throw new InvalidArgumentError(`${name} must be a whole number of 0 or more, got "${value}".`);
    return n;
  };
}

/** Repeatable KEY=VALUE options collected into a map. */
export function keyValue(name: string) {
  return (value: string, previous: Record<string, string> = {}): Record<string, string> => {
    const eq = value.indexOf("=");
    if (eq <= 0) throw new InvalidArgumentError(`${name} takes KEY=VALUE, got "${value}".`);
    return { ...previous, [value.slice(0, eq)]: value.slice(eq + 1) };
  };
}

export function collect(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}
