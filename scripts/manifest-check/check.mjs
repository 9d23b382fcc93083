// Validates rendered Kubernetes manifests offline:
//  1. every object against the Kubernetes API schemas (kubernetes-models: types, required
//     fields, enums, formats), and the Prometheus Operator's objects against its CRDs' schemas
//     (@kubernetes-models/prometheus-operator);
//  2. the device plugin's DaemonSet stays unprivileged and keeps what the README promises.
// usage: node check.mjs FILE.yaml...   (multi-document YAML, e.g. `kubectl kustomize` output)
import { readFileSync } from "node:fs";
import yaml from "js-yaml";

const failures = [];
const fail = (where, what) => failures.push(`${where}: ${what}`);

// Host paths the DaemonSet may mount, and whether it may write there.
const HOST_PATHS = new Map([
  ["/var/lib/kubelet/device-plugins", "rw"],  // kubelet.sock and our sockets
  ["/var/lib/kubelet/plugins_registry", "rw"],  // plugin-watcher registration
  ["/var/snap/microk8s/common/var/lib/kubelet/plugins_registry", "rw"],
  ["/var/lib/rancher/k3s/agent/kubelet/plugins_registry", "rw"],
  // The kubelet's pod-resources API (who holds which devices), read only.
  ["/var/lib/kubelet/pod-resources", "ro"],
  ["/var/snap/microk8s/common/var/lib/kubelet/pod-resources", "ro"],
  ["/var/lib/rancher/k3s/agent/kubelet/pod-resources", "ro"],
  ["/etc/kubernetes/node-feature-discovery/features.d", "rw"],  // the NFD feature file
  ["/var/run/cdi", "rw"],  // the CDI specs (components/cdi)
  ["/dev", "ro"],
  ["/sys", "ro"],
  ["/proc/meminfo", "ro"],
  ["/etc/nv_tegra_release", "ro"],
  ["/proc/driver/nvidia", "ro"],
  // Where the NVML helper finds and loads the host's libnvidia-ml.so.1 (components/nvidia-discrete).
  ["/etc/ld.so.cache", "ro"],
  ["/usr/lib", "ro"],
]);

async function validateSchema(where, obj) {
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
  const volumes = new Map((pod.volumes || []).map((v) => [v.name, v]));
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
    for (const probe of ["livenessProbe", "readinessProbe"]) {
      expect(c[probe]?.httpGet?.path === "/healthz", `${at}: ${probe} on /healthz`);
    }
    for (const kind of ["requests", "limits"]) {
      expect(c.resources?.[kind]?.cpu && c.resources?.[kind]?.memory, `${at}: resources.${kind} cpu and memory`);
    }
    for (const m of c.volumeMounts || []) {
      const v = volumes.get(m.name);
      if (!v?.hostPath) continue;
      const allowed = HOST_PATHS.get(v.hostPath.path);
      if (!allowed) {
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
