// Runs the DRA DeviceClasses' and the example claims' CEL selectors, offline, on the devices
// docs/dra.md describes (each family, with and without its optional attributes, and another
// driver's GPU), the way the scheduler does: a device fits a request when its class's selectors
// and then the request's all hold; a selector that fails to evaluate (an attribute the device
// lacks) fails the whole claim. Each class and each example template must take exactly the
// devices listed below. CEL: @marcbachmann/cel-js, with the Kubernetes functions the selectors
// use (semver(), quantity(), compareTo()).
// usage: node check-dra.mjs RENDERED.yaml [EXAMPLE.yaml...]   (the classes are in RENDERED)
import { readFileSync } from "node:fs";
import yaml from "js-yaml";
import { Environment } from "@marcbachmann/cel-js";

class Semver {
  constructor(text) {
    const m = /^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$/.exec(text);
    if (!m) throw new Error(`not a semantic version: ${text}`);
    this.parts = m.slice(1).map(BigInt);
  }
  compareTo(other) {
    for (let i = 0; i < 3; i++) {
      if (this.parts[i] !== other.parts[i]) return this.parts[i] < other.parts[i] ? -1n : 1n;
    }
    return 0n;
  }
}
class Quantity {
  static SUFFIX = { "": 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40 };
  constructor(text) {
    const m = /^([0-9]+(?:\.[0-9]+)?)(|k|M|G|T|Ki|Mi|Gi|Ti)$/.exec(text);
    if (!m) throw new Error(`not a quantity: ${text}`);
    this.value = Number(m[1]) * Quantity.SUFFIX[m[2]];
  }
  compareTo(other) {
    return this.value === other.value ? 0n : this.value < other.value ? -1n : 1n;
  }
}
const env = new Environment({ unlistedVariablesAreDyn: true })
  .registerType("Semver", Semver)
  .registerType("Quantity", Quantity)
  .registerFunction("semver(string): Semver", (s) => new Semver(s))
  .registerFunction("quantity(string): Quantity", (s) => new Quantity(s))
  .registerFunction({ name: "compareTo", receiverType: "Semver", returnType: "int",
                      params: [{ name: "other", type: "Semver" }], handler: (a, b) => a.compareTo(b) })
  .registerFunction({ name: "compareTo", receiverType: "Quantity", returnType: "int",
                      params: [{ name: "other", type: "Quantity" }], handler: (a, b) => a.compareTo(b) });

// A device as a selector sees it: attributes and capacity grouped by domain (unprefixed names are
// the driver's); a domain the device has nothing in reads as an empty map.
const DOMAINS = ["edgetpu.edgeaccel.io", "gpu.edgeaccel.io", "gpu.nvidia.com"];
function device(driver, attributes, capacity = {}) {
  const value = (a) => a.string ?? a.bool ?? (a.int !== undefined ? BigInt(a.int) : new Semver(a.version));
  const group = (map, convert) => Object.fromEntries(DOMAINS.map((d) => [d, d === driver
    ? Object.fromEntries(Object.entries(map).map(([k, v]) => [k, convert(v)])) : {}]));
  return { driver, attributes: group(attributes, value), capacity: group(capacity, (q) => new Quantity(q)) };
}
const tpu = (bus, extra) => device("edgetpu.edgeaccel.io", {
  type: { string: "edgetpu" }, bus: { string: bus }, vendorId: { string: bus === "pci" ? "1ac1" : "18d1" },
  productId: { string: bus === "pci" ? "089a" : "9302" }, driverVersion: { version: "1.2.0" },
  frameworkVersion: { version: "1.1.4" }, ...extra,
});
const jetson = (soc, cc, memory) => device("gpu.edgeaccel.io", {
  type: { string: "gpu" }, integrated: { bool: true }, soc: { string: soc }, gpu: { string: "ga10b" },
  l4tVersion: { version: "36.4.7" }, computeCapability: { version: cc },
}, { memory });
const DEVICES = {
  "tpu-0000-03-00-0": tpu("pci", { model: { string: "Coral M.2/PCIe Accelerator" },
    pciAddress: { string: "0000:03:00.0" }, numaNode: { int: 0 }, temperatureThresholdCelsius: { int: 90 } }),
  // A PCIe TPU whose driver reports no temperature: no temperatureThresholdCelsius.
  "tpu-0000-04-00-0": tpu("pci", { model: { string: "Coral M.2/PCIe Accelerator" }, pciAddress: { string: "0000:04:00.0" } }),
  "tpu-usb-2-1": tpu("usb", { model: { string: "Coral USB Accelerator" }, usbPort: { string: "2-1" } }),
  "gpu-agx-orin-64gb": jetson("tegra234", "8.7.0", "62841Mi"),
  "gpu-orin-nx-16gb": jetson("tegra234", "8.7.0", "15656Mi"),
  "gpu-agx-xavier-32gb": jetson("tegra194", "7.2.0", "31920Mi"),
  "gpu-3291dfa4-fcc4-0110-615b-c894a0d7c689": device("gpu.edgeaccel.io", {
    type: { string: "gpu" }, integrated: { bool: false }, uuid: { string: "GPU-3291dfa4-fcc4-0110-615b-c894a0d7c689" },
    productName: { string: "NVIDIA L4" }, pciAddress: { string: "0000:01:00.0" }, minor: { int: 0 },
    driverVersion: { version: "580.159.4" }, computeCapability: { version: "8.9.0" },
  }, { memory: "23034Mi" }),
  // NVIDIA's own DRA driver's GPU: none of our classes may take it.
  "nvidia-gpu-0": device("gpu.nvidia.com", { type: { string: "gpu" }, productName: { string: "NVIDIA L4" } }),
};
const TPUS = ["tpu-0000-03-00-0", "tpu-0000-04-00-0", "tpu-usb-2-1"];
const JETSONS = ["gpu-agx-orin-64gb", "gpu-orin-nx-16gb", "gpu-agx-xavier-32gb"];
// What each class, and each example's request (template/request), must take.
const WANT = {
  "edgetpu.edgeaccel.io": TPUS,
  "jetson-gpu.edgeaccel.io": JETSONS,
  "gpu.edgeaccel.io": ["gpu-3291dfa4-fcc4-0110-615b-c894a0d7c689"],
  "edgetpu/tpu": TPUS,
  "edgetpu-pcie/tpu": ["tpu-0000-03-00-0"],
  "jetson-orin-gpu/gpu": ["gpu-agx-orin-64gb"],
};

// The devices all these selectors take; throws on a CEL error (which fails a claim).
function take(selectors, where) {
  return Object.keys(DEVICES).filter((name) => selectors.every((s, i) => {
    let got;
    try {
      got = env.evaluate(s.cel.expression, { device: DEVICES[name] });
    } catch (e) {
      throw new Error(`${where}: selector #${i} on ${name}: ${e.message.split("\n")[0]}`);
    }
    if (typeof got !== "boolean") throw new Error(`${where}: selector #${i} on ${name}: ${got} is not a bool`);
    return got;
  }));
}

const load = (file) => yaml.loadAll(readFileSync(file, "utf8")).filter(Boolean);
const [rendered, ...examples] = process.argv.slice(2);
const classes = new Map(load(rendered).filter((d) => d.kind === "DeviceClass").map((d) => [d.metadata.name, d]));
const problems = [];
const compare = (what, got) => {
  const want = WANT[what];
  if (!want) return problems.push(`${what}: no devices listed in check-dra.mjs for it`);
  if (got.join() !== want.join()) problems.push(`${what}: takes ${got.join(", ") || "nothing"}; want ${want.join(", ")}`);
};
for (const name of ["edgetpu.edgeaccel.io", "jetson-gpu.edgeaccel.io", "gpu.edgeaccel.io"]) {
  if (!classes.has(name)) problems.push(`${rendered}: no DeviceClass ${name}`);
}
let checked = 0;
for (const [name, cls] of classes) {
  try {
    compare(name, take(cls.spec.selectors || [], `DeviceClass ${name}`));
    checked++;
  } catch (e) {
    problems.push(e.message);
  }
}
for (const file of examples) {
  for (const tmpl of load(file).filter((d) => d.kind === "ResourceClaimTemplate")) {
    for (const request of tmpl.spec.spec.devices.requests) {
      const what = `${tmpl.metadata.name}/${request.name}`;
      const cls = classes.get(request.exactly.deviceClassName);
      if (!cls) {
        problems.push(`${file}: ${what}: no DeviceClass ${request.exactly.deviceClassName}`);
        continue;
      }
      try {
        compare(what, take([...(cls.spec.selectors || []), ...(request.exactly.selectors || [])], `${file}: ${what}`));
        checked++;
      } catch (e) {
        problems.push(e.message);
      }
    }
  }
}
if (problems.length) {
  for (const p of problems) console.error(p);
  process.exit(1);
}
console.log(`DRA selectors: ${checked} classes and requests take the devices they must, of ${Object.keys(DEVICES).length}`);
