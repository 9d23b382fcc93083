// Validates rendered Kubernetes manifests offline:
//  1. every object against the Kubernetes API schemas (kubernetes-models: types, required
//     fields, enums, formats), and the Prometheus Operator's objects against its CRDs' schemas
//     (@kubernetes-models/prometheus-operator); resource.k8s.io/v1 (DRA), which kubernetes-models
//     4.5.1 lacks, against the API server's own OpenAPI schemas (resource.k8s.io-v1.schema.json:
//     types, required fields, and no field the API does not know);
//  2. the device plugin's DaemonSet stays unprivileged and keeps what the README promises: only the
//     host paths listed below, none wider (a parent of one, e.g. the kubelet's whole plugins/);
//     with --dra it has what the DRA driver needs (docs/dra.md): plugins/<driver> for each driver
//     its families use, and no other driver's.
// usage: node check.mjs FILE.yaml...   (multi-document YAML, e.g. `kubectl kustomize` output)
import { readFileSync } from "node:fs";
import yaml from "js-yaml";

// OpenAPI schemas taken from the API server for the groups kubernetes-models has none of.
const OPENAPI = {
  "resource.k8s.io/v1": new URL("./resource.k8s.io-v1.schema.json", import.meta.url),
};

const failures = [];
const fail = (where, what) => failures.push(`${where}: ${what}`);

// Host paths the DaemonSet may mount, and whether it may write there.
const HOST_PATHS = new Map([
  ["/var/lib/kubelet/device-plugins", "rw"],  // kubelet.sock and our sockets
  ["/var/lib/kubelet/plugins_registry", "rw"],  // plugin-watcher registration
  ["/var/snap/microk8s/common/var/lib/kubelet/plugins_registry", "rw"],
  ["/var/lib/rancher/k3s/agent/kubelet/plugins_registry", "rw"],
  // DRA (--dra), one per driver: <driver>/dra.sock, the kubelet's DRA service, and
  // <driver>/checkpoint.json. Never plugins/ itself: it holds every CSI and DRA driver's sockets.
  ["/var/lib/kubelet/plugins/edgetpu.edgeaccel.io", "rw"],
  ["/var/lib/kubelet/plugins/gpu.edgeaccel.io", "rw"],
  // The kubelet's pod-resources API (who holds which devices), read only.
  ["/var/lib/kubelet/pod-resources", "ro"],
  ["/var/snap/microk8s/common/var/lib/kubelet/pod-resources", "ro"],
  ["/var/lib/rancher/k3s/agent/kubelet/pod-resources", "ro"],
  ["/etc/kubernetes/node-feature-discovery/features.d", "rw"],  // the NFD feature file
  ["/var/run/cdi", "rw"],  // the CDI specs (components/cdi)
  ["/dev", "ro"],
  ["/sys", "ro"],
  ["/proc/meminfo", "ro"],
  ["/proc/sys/kernel/random/boot_id", "ro"],  // DRA: a reboot is told by it (docs/dra.md)
  ["/etc/nv_tegra_release", "ro"],
  ["/proc/driver/nvidia", "ro"],
  // Where the NVML helper finds and loads the host's libnvidia-ml.so.1, and where the driver's
  // libraries for containers are found (components/nvidia-discrete): Debian's and Ubuntu's
  // /usr/lib, RHEL's /usr/lib64, the GPU Operator's driver root under /run/nvidia.
  ["/etc/ld.so.cache", "ro"],
  ["/usr/lib", "ro"],
  ["/usr/lib64", "ro"],
  ["/run/nvidia", "ro"],
  // L4T's container file lists: what a Jetson's GPU containers get (docs/driver-libraries.md).
  ["/etc/nvidia-container-runtime/host-files-for-container.d", "ro"],
]);

// The DRA driver that publishes each family (include/edgeaccel/dra/dra_driver.h), and where the
// kubelet finds its socket: the same path inside the pod and on the host, since the kubelet dials
// the path the daemon registers.
const DRA_DRIVERS = {
  "coral-pcie": "edgetpu.edgeaccel.io", "coral-usb": "edgetpu.edgeaccel.io",
  tegra: "gpu.edgeaccel.io", nvidia: "gpu.edgeaccel.io",
};
const draDir = (driver) => `/var/lib/kubelet/plugins/${driver}`;

// Validates a value against an OpenAPI v3 schema of the API server's (the subset it uses: $ref,
// allOf, oneOf, type, format int-or-string, properties, additionalProperties, items, required,
// enum). An object schema that lists properties takes no others, as the API server's strict
// field validation (kubectl's default) refuses unknown fields; one without is free-form.
function validateOpenAPI(schemas, schema, value, path, errors) {
  if (schema.$ref) return validateOpenAPI(schemas, schemas[schema.$ref], value, path, errors);
  for (const part of schema.allOf || []) validateOpenAPI(schemas, part, value, path, errors);
  if (value === null || value === undefined) return;  // an optional field left empty
  if (schema.oneOf) {
    const ok = schema.oneOf.some((alt) => {
      const e = [];
      validateOpenAPI(schemas, alt, value, path, e);
      return e.length === 0;
    });
    if (!ok) errors.push(`${path || "/"}: must be ${schema.oneOf.map((alt) => alt.type).join(" or ")}`);
  }
  if (schema["x-kubernetes-int-or-string"]) {
    if (typeof value !== "string" && !Number.isInteger(value)) errors.push(`${path}: must be an integer or a string`);
    return;
  }
  const isObject = typeof value === "object" && !Array.isArray(value);
  const typeOk = {
    object: isObject, array: Array.isArray(value), string: typeof value === "string",
    integer: Number.isInteger(value), number: typeof value === "number", boolean: typeof value === "boolean",
  }[schema.type];
  if (schema.type && typeOk === false) return errors.push(`${path || "/"}: must be ${schema.type}`);
  if (schema.enum && !schema.enum.includes(value)) errors.push(`${path}: must be one of ${schema.enum.join(", ")}`);
  if (Array.isArray(value) && schema.items) {
    value.forEach((item, i) => validateOpenAPI(schemas, schema.items, item, `${path}/${i}`, errors));
  }
  if (!isObject) return;
  for (const field of schema.required || []) {
    if (value[field] === undefined) errors.push(`${path || "/"}: must have required property ${field}`);
  }
  for (const [field, v] of Object.entries(value)) {
    const sub = schema.properties?.[field] ??
      (typeof schema.additionalProperties === "object" ? schema.additionalProperties : null);
    if (sub) validateOpenAPI(schemas, sub, v, `${path}/${field}`, errors);
    else if (schema.properties) errors.push(`${path}/${field}: unknown field`);
  }
}

const openapiCache = new Map();
function validateWithOpenAPI(where, obj) {
  if (!openapiCache.has(obj.apiVersion)) {
    openapiCache.set(obj.apiVersion, JSON.parse(readFileSync(OPENAPI[obj.apiVersion], "utf8")).schemas);
  }
  const schemas = openapiCache.get(obj.apiVersion);
  const [group, version] = obj.apiVersion.split("/");
  const name = Object.keys(schemas).find((n) => (schemas[n]["x-kubernetes-group-version-kind"] || [])
    .some((gvk) => gvk.group === group && gvk.version === version && gvk.kind === obj.kind));
  if (!name) return fail(where, `no schema for kind ${obj.kind} in ${obj.apiVersion}`);
  const errors = [];
  validateOpenAPI(schemas, schemas[name], obj, "", errors);
  for (const e of errors) fail(where, e);
}

async function validateSchema(where, obj) {
  if (OPENAPI[obj.apiVersion]) return validateWithOpenAPI(where, obj);
  const [group, version] = obj.apiVersion.includes("/")
    ? obj.apiVersion.split("/")
    : [null, obj.apiVersion];
  // Custom resources we ship: their operator's schemas (the Prometheus Operator's CRDs).
  const crdModels = { "monitoring.coreos.com": "@kubernetes-models/prometheus-operator" };
  const module = `${crdModels[group] ?? "kubernetes-models"}/${group ? `${group}/` : ""}${version}`;
  let models;
  try {
    models = await import(module);
  } catch (e) {
    return fail(where, `no schema for apiVersion ${obj.apiVersion}`);
  }
  const Model = models[obj.kind];
  if (!Model) return fail(where, `no schema for kind ${obj.kind} in ${obj.apiVersion}`);
  try {
    new Model(obj).validate();
  } catch (e) {
    fail(where, e.message);
  }
}

function checkDevicePlugin(where, ds) {
  const expect = (ok, what) => ok || fail(where, what);
  expect(ds.metadata.namespace === "kube-system", "must be in kube-system");
  const pod = ds.spec.template.spec;
  expect(pod.priorityClassName === "system-node-critical", "priorityClassName must be system-node-critical");
  for (const field of ["hostNetwork", "hostPID", "hostIPC"]) expect(pod[field] !== true, `${field} must be off`);
  expect(ds.spec.updateStrategy?.type === "RollingUpdate", "updateStrategy must be RollingUpdate");
  // The new daemon starts before the old one goes, so it takes over the moment the old one's
  // sockets go (docs/kubelet-behaviour.md section 11): with maxUnavailable instead, every
  // device is Unhealthy at the kubelet for a whole pod start, and pods admitted then fail.
  const rolling = ds.spec.updateStrategy?.rollingUpdate || {};
  expect(rolling.maxSurge === 1 && rolling.maxUnavailable === 0,
         "updateStrategy must be rollingUpdate {maxSurge: 1, maxUnavailable: 0}");
  const volumes = new Map((pod.volumes || []).map((v) => [v.name, v]));
  // Components that mount the same directory (cdi, dra) must leave it there once.
  const dupes = (list) => list.filter((x, i) => list.indexOf(x) !== i);
  for (const name of dupes((pod.volumes || []).map((v) => v.name))) fail(where, `volume ${name} appears twice`);
  for (const c of [...(pod.initContainers || []), ...pod.containers]) {
    const at = `container ${c.name}`;
    const sc = c.securityContext || {};
    expect(sc.privileged !== true, `${at}: must not be privileged`);
    expect(sc.allowPrivilegeEscalation === false, `${at}: allowPrivilegeEscalation must be false`);
    expect(sc.readOnlyRootFilesystem === true, `${at}: readOnlyRootFilesystem must be true`);
    expect((sc.capabilities?.drop || []).includes("ALL"), `${at}: capabilities.drop must include ALL`);
    expect(!(sc.capabilities?.add || []).length, `${at}: must not add capabilities`);
    const env = (c.env || []).find((e) => e.name === "NODE_NAME");
    expect(env?.valueFrom?.fieldRef?.fieldPath === "spec.nodeName", `${at}: NODE_NAME from the downward API`);
    // Readiness on everything; liveness leaves out what a restart cannot cure (a slice the API
    // server refuses), or an API server outage would restart the daemon every minute.
    for (const [probe, path] of [["readinessProbe", "/healthz"], ["livenessProbe", "/livez"]]) {
      expect(c[probe]?.httpGet?.path === path, `${at}: ${probe} on ${path}`);
    }
    for (const kind of ["requests", "limits"]) {
      expect(c.resources?.[kind]?.cpu && c.resources?.[kind]?.memory, `${at}: resources.${kind} cpu and memory`);
    }
    for (const path of dupes((c.volumeMounts || []).map((m) => m.mountPath))) {
      fail(where, `${at}: ${path} is mounted twice`);
    }
    // DRA (docs/dra.md): the kubelet's plugins/<driver> for each driver the families use (the
    // service socket and the checkpoint) and nothing else of plugins/, plugins_registry/ to
    // register, the CDI dir for the claims' specs (all writable), and the API server (the pod's
    // token) for the ResourceSlices and ResourceClaims.
    const dra = (c.args || []).find((a) => a.startsWith("--dra="));
    const families = dra ? dra.slice("--dra=".length).split(",") : [];
    const drivers = new Set(families.flatMap((f) => (f === "all" ? Object.values(DRA_DRIVERS) : [DRA_DRIVERS[f]])));
    const mountOf = (path) => (c.volumeMounts || []).find((m) => m.mountPath === path);
    if (dra) {
      const paths = [...[...drivers].map(draDir), "/var/lib/kubelet/plugins_registry", "/var/run/cdi"];
      for (const path of paths) {
        const m = mountOf(path);
        expect(m && m.readOnly !== true, `${at}: ${dra} needs ${path} mounted writable`);
        const v = m && volumes.get(m.name);
        if (v?.hostPath && path.startsWith("/var/lib/kubelet/plugins/")) {
          expect(v.hostPath.path === path, `${at}: ${path} must be the host's ${path} (the kubelet dials the path the daemon registers), not ${v.hostPath.path}`);
        }
      }
      expect(pod.serviceAccountName && pod.automountServiceAccountToken !== false,
             `${at}: --dra needs a service account and its token`);
    }
    for (const [driver, path] of Object.values(DRA_DRIVERS).map((d) => [d, draDir(d)])) {
      if (mountOf(path) && !drivers.has(driver)) {
        fail(where, `${at}: mounts ${path}, which ${dra ?? "without --dra, nothing"} uses`);
      }
    }
    for (const m of c.volumeMounts || []) {
      const v = volumes.get(m.name);
      if (!v) fail(where, `${at}: volume ${m.name} of ${m.mountPath} is not in the pod`);
      if (!v?.hostPath) continue;
      const allowed = HOST_PATHS.get(v.hostPath.path);
      const wider = [...HOST_PATHS.keys()].filter((p) => p.startsWith(`${v.hostPath.path.replace(/\/$/, "")}/`));
      if (!allowed && wider.length) {
        const needs = wider.length > 2 ? `${wider[0]} and ${wider.length - 1} more below it` : wider.join(" and ");
        fail(where, `${at}: hostPath ${v.hostPath.path} is wider than the plugin needs (only ${needs}): ` +
                    "it holds other programs' files and sockets");
      } else if (!allowed) {
        fail(where, `${at}: hostPath ${v.hostPath.path} is not one the plugin needs`);
      } else if (allowed === "ro" && m.readOnly !== true) {
        fail(where, `${at}: hostPath ${v.hostPath.path} must be mounted readOnly`);
      }
    }
  }
}

let objects = 0;
for (const file of process.argv.slice(2)) {
  let docs;
  try {
    docs = yaml.loadAll(readFileSync(file, "utf8")).filter((d) => d != null);
  } catch (e) {
    fail(file, `not YAML: ${e.message}`);
    continue;
  }
  for (const obj of docs) {
    const where = `${file}: ${obj.kind}/${obj.metadata?.name}`;
    objects++;
    await validateSchema(where, obj);
    if (obj.kind === "DaemonSet" && obj.metadata?.name === "edgeaccel-device-plugin") {
      checkDevicePlugin(where, obj);
    }
  }
}
if (failures.length) {
  console.error(failures.join("\n"));
  console.error(`${failures.length} problem(s)`);
  process.exit(1);
}
console.log(`${objects} object(s) valid`);
