import { Migration0001Identity } from "./0001-identity.ts";
import { Migration0002Sandboxes } from "./0002-sandboxes.ts";
import { Migration0004Identity } from "./0004-identity.ts";
import { Migration0005Users } from "./0005-users.ts";
import { Migration0006Organizations } from "./0006-organizations.ts";
import { Migration0007RateLimits } from "./0007-rate-limits.ts";
import { Migration0008Preview } from "./0008-preview.ts";
import { Migration0009Webhooks } from "./0009-webhooks.ts";
import { Migration0010Audit } from "./0010-audit.ts";
import { Migration0011Snapshots } from "./0011-snapshots.ts";
import { Migration0012DockerRegistries } from "./0012-docker-registries.ts";
import { Migration0013Volumes } from "./0013-volumes.ts";
import { Migration0014SandboxNetwork } from "./0014-sandbox-network.ts";
import { Migration0016Builds } from "./0016-builds.ts";
import { Migration0017RegistryPushCredentials } from "./0017-registry-push-credentials.ts";
import { Migration0018Runners } from "./0018-runners.ts";
import { Migration0019RunnerImages } from "./0019-runner-images.ts";
import { Migration0021SandboxClassGpu } from "./0021-sandbox-class-gpu.ts";
import { Migration0022DeletedUsers } from "./0022-deleted-users.ts";
import { Migration0023SignInAddresses } from "./0023-sign-in-addresses.ts";
import { Migration0025Layers } from "./0025-layers.ts";

/** Every migration, in order. Applied at start; never edit one that has shipped, add the next. */
export const migrations = [
  { name: "0001-identity", class: Migration0001Identity },
  { name: "0002-sandboxes", class: Migration0002Sandboxes },
  { name: "0004-identity", class: Migration0004Identity },
  { name: "0005-users", class: Migration0005Users },
  { name: "0006-organizations", class: Migration0006Organizations },
  { name: "0007-rate-limits", class: Migration0007RateLimits },
  { name: "0008-preview", class: Migration0008Preview },
  { name: "0009-webhooks", class: Migration0009Webhooks },
  { name: "0010-audit", class: Migration0010Audit },
  { name: "0011-snapshots", class: Migration0011Snapshots },
  { name: "0012-docker-registries", class: Migration0012DockerRegistries },
  { name: "0013-volumes", class: Migration0013Volumes },
  { name: "0014-sandbox-network", class: Migration0014SandboxNetwork },
  { name: "0016-builds", class: Migration0016Builds },
  { name: "0017-registry-push-credentials", class: Migration0017RegistryPushCredentials },
  { name: "0018-runners", class: Migration0018Runners },
  { name: "0019-runner-images", class: Migration0019RunnerImages },
  { name: "0021-sandbox-class-gpu", class: Migration0021SandboxClassGpu },
  { name: "0022-deleted-users", class: Migration0022DeletedUsers },
  { name: "0023-sign-in-addresses", class: Migration0023SignInAddresses },
  { name: "0025-layers", class: Migration0025Layers },
];
