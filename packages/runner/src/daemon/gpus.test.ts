import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { detectGpus, gpuTypeOf, loadGpus } from "./gpus.ts";

// The GPUs a runner reports: this machine has none, so the host's /dev and the driver's /proc
// files are stood in by a temporary directory with the same names and contents.

const dirs: string[] = [];
async function host(devices: string[], models: string[]): Promise<{ dev: string; driver: string }> {
  const root = await mkdtemp(path.join(tmpdir(), "sandbar-gpus-"));
  dirs.push(root);
  const dev = path.join(root, "dev");
  const driver = path.join(root, "gpus");
  await mkdir(dev);
  await mkdir(driver);
  for (const d of devices) await writeFile(path.join(dev, d), "");
  for (const [i, m] of models.entries()) {
    await mkdir(path.join(driver, `0000:0${i}:00.0`));
    await writeFile(path.join(driver, `0000:0${i}:00.0`, "information"), `Model: \t\t ${m}\nIRQ:   \t\t 35\nGPU UUID: \t GPU-1\n`);
  }
  return { dev, driver };
}

afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

describe("the GPUs a runner reports", () => {
  it("counts /dev/nvidiaN (not nvidiactl, nvidia-uvm) and names the model the driver reports", async () => {
    const h = await host(["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "null"], ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]);
    expect(detectGpus(h.dev, h.driver)).toEqual({ count: 2, type: "H100" });
  });

  it("no NVIDIA device: no GPU, whatever else is there", async () => {
    const h = await host(["nvidiactl", "null"], ["NVIDIA H100 80GB HBM3"]);
    expect(detectGpus(h.dev, h.driver)).toEqual({ count: 0, type: "" });
    expect(detectGpus(path.join(h.dev, "missing"), h.driver)).toEqual({ count: 0, type: "" });
  });

  it("spells driver model names as the GPU types", () => {
    expect(gpuTypeOf("NVIDIA RTX PRO 6000 Blackwell Server Edition")).toBe("RTX-PRO-6000");
    expect(gpuTypeOf("NVIDIA GeForce RTX 4090")).toBe("RTX-4090");
    expect(gpuTypeOf("NVIDIA H200")).toBe("H200");
    expect(gpuTypeOf("NVIDIA H100 PCIe")).toBe("H100");
    expect(gpuTypeOf("Tesla T4")).toBe("");
    expect(gpuTypeOf("NVIDIA GH100X")).toBe("");
  });

  it("settings win over what the host has; a wrong setting is refused by name", async () => {
    const found = () => ({ count: 8, type: "H100" });
    expect(loadGpus({}, found)).toEqual({ count: 8, type: "H100" });
    expect(loadGpus({ SANDBAR_RUNNER_GPU: "0" }, found)).toEqual({ count: 0, type: "" });
    expect(loadGpus({ SANDBAR_RUNNER_GPU: "2", SANDBAR_RUNNER_GPU_TYPE: "RTX-PRO-6000" }, found)).toEqual({ count: 2, type: "RTX-PRO-6000" });
    expect(loadGpus({ SANDBAR_RUNNER_GPU_TYPE: "H200" }, found)).toEqual({ count: 8, type: "H200" });
    expect(() => loadGpus({ SANDBAR_RUNNER_GPU: "-1" }, found)).toThrow('SANDBAR_RUNNER_GPU must be a whole number from 0 to 64, got "-1"');
    expect(() => loadGpus({ SANDBAR_RUNNER_GPU: "1.5" }, found)).toThrow("SANDBAR_RUNNER_GPU must be a whole number");
    expect(() => loadGpus({ SANDBAR_RUNNER_GPU_TYPE: "GTX-280" }, found)).toThrow('SANDBAR_RUNNER_GPU_TYPE must be one of H100, RTX-PRO-6000, H200, B300, RTX-4090, RTX-5090, MI355X, got "GTX-280"');
  });
});
