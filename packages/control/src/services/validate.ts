import { errors } from "@sandbar/protocol";

/** Collects input problems and raises them together as one INVALID_ARGUMENT, like the reference. */
export class Checks {
  private readonly problems: string[] = [];

  displayName(field: string, value: string, max = 255): this {
    if (value.trim() === "") this.problems.push(`${field} should not be empty`);
    else if (value.length > max) this.problems.push(`${field} must be shorter than or equal to ${max} characters`);
    else if (!isSafeDisplayString(value)) this.problems.push(`${field} must not contain HTML tags, URLs, or control characters`);
    return this;
  }

  that(ok: boolean, problem: string): this {
    if (!ok) this.problems.push(problem);
    return this;
  }

  done(): void {
    if (this.problems.length) throw errors.invalidArgument(this.problems.join(", "));
  }
}

const URL_SCHEME = /(https?:\/\/|ftps?:\/\/|sftp:\/\/|ssh:\/\/|wss?:\/\/|file:\/\/|ldaps?:\/\/|javascript:|data:|mailto:|tel:|www\.)/i;

/** Names shown in dashboards and logs: no markup, no links, no control characters. */
export function isSafeDisplayString(value: string): boolean {
  return !/<[^>]*>/.test(value) && !URL_SCHEME.test(value) && !/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/.test(value);
}
