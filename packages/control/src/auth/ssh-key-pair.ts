import { generateKeyPair } from "node:crypto";
import { promisify } from "node:util";

// A user's SSH key pair as the reference hands it out: RSA-4096, the public half in OpenSSH's
// `ssh-rsa AAAA… comment` form, the private half PEM (PKCS#1, which OpenSSH reads).

const generate = promisify(generateKeyPair);

export interface SshKeyPair {
  privateKey: string;
  publicKey: string;
}

export async function sshKeyPair(comment = "sandbar"): Promise<SshKeyPair> {
  const { publicKey, privateKey } = await generate("rsa", { modulusLength: 4096 });
  const jwk = publicKey.export({ format: "jwk" });
  const blob = Buffer.concat([sshString(Buffer.from("ssh-rsa")), sshString(mpint(jwk.e!)), sshString(mpint(jwk.n!))]);
  return {
    privateKey: privateKey.export({ format: "pem", type: "pkcs1" }).toString(),
    publicKey: `ssh-rsa ${blob.toString("base64")} ${comment}`,
  };
}

function sshString(b: Buffer): Buffer {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(b.length);
  return Buffer.concat([len, b]);
}

/** An unsigned big-endian integer as SSH's mpint: a leading zero when the top bit is set. */
function mpint(base64url: string): Buffer {
  const b = Buffer.from(base64url, "base64url");
  return b[0]! & 0x80 ? Buffer.concat([Buffer.from([0]), b]) : b;
}
