// Runs the ValidatingAdmissionPolicies' CEL (matchConditions, variables, validations) the way the
// API server evaluates them, with a CEL interpreter (@marcbachmann/cel-js), offline: the own-node
// policy on Node updates, the DRA own-slices policy on ResourceSlice creates, updates and deletes
// from the daemon's service account (and others'). What must be allowed is, what must be denied
// is, and each denial says why.
// usage: node check-admission-policy.mjs FILE.yaml   (holds the policies, among other objects)
import { readFileSync } from "node:fs";
import yaml from "js-yaml";
import * as cel from "@marcbachmann/cel-js";

const docs = yaml.loadAll(readFileSync(process.argv[2], "utf8")).filter(Boolean);
const policies = docs.filter((d) => d.kind === "ValidatingAdmissionPolicy");
if (!policies.length) {
  console.error(`${process.argv[2]}: no ValidatingAdmissionPolicy`);
  process.exit(1);
}

const SA = "system:serviceaccount:kube-system:edgeaccel-device-plugin";
const node = (name, labels, annotations = {}, spec = { podCIDR: "10.0.0.0/24" }) => ({
  apiVersion: "v1", kind: "Node", metadata: { name, labels, annotations }, spec,
});
const base = { "kubernetes.io/hostname": "n1", "node-role.kubernetes.io/worker": "" };
// nodeName null: a bound token without the node claim; undefined: no extra at all (a legacy
// Secret token; the API server then leaves userInfo.extra out).
const request = (user, nodeName, operation = "UPDATE") => ({
  operation,
  userInfo: {
    username: user,
    ...(nodeName === undefined ? {} : { extra: nodeName ? { "authentication.kubernetes.io/node-name": [nodeName] } : {} }),
  },
});

// Evaluates a policy on one request; returns null (allowed or not matched) or the denial.
function admit(policy, req, oldObject, object) {
  const ctx = { request: req, object, oldObject };
  for (const c of policy.spec.matchConditions || []) {
    if (cel.evaluate(c.expression, ctx) !== true) return null;
  }
  ctx.variables = {};
  for (const v of policy.spec.variables || []) ctx.variables[v.name] = cel.evaluate(v.expression, ctx);
  for (const v of policy.spec.validations) {
    if (cel.evaluate(v.expression, ctx) !== true) {
      return v.messageExpression ? cel.evaluate(v.messageExpression, ctx) : v.message;
    }
  }
  return null;
}

const ours = { ...base, "coral.ai/edgetpu.present": "true", "nvidia.com/gpu.count": "1" };
const managed = { "edgeaccel.io/managed-labels": "coral.ai/edgetpu.present,nvidia.com/gpu.count" };
const nodeCases = [
  ["our labels and annotation on our own node", request(SA, "n1"), node("n1", base), node("n1", ours, managed), null],
  ["removing our labels", request(SA, "n1"), node("n1", ours, managed), node("n1", base, {}), null],
  ["seed labels (gpu.*)", request(SA, "n1"), node("n1", base), node("n1", { ...base, "gpu.model": "x" }), null],
  ["another user is not this policy's business", request("system:node:n2", "n2"), node("n1", base), node("n1", { ...base, "x/y": "1" }), null],
  ["another node", request(SA, "n1"), node("n2", base), node("n2", ours), "only the Node its pod runs on (n1), not n2"],
  ["a token that does not name the node", request(SA, null), node("n1", base), node("n1", ours), "its token does not say which"],
  ["a token without extra", request(SA, undefined), node("n1", base), node("n1", ours), "its token does not say which"],
  ["someone else's label", request(SA, "n1"), node("n1", base), node("n1", { ...base, "node-role.kubernetes.io/control-plane": "" }), "not node-role.kubernetes.io/control-plane"],
  ["removing someone else's label", request(SA, "n1"), node("n1", base), node("n1", { "kubernetes.io/hostname": "n1" }), "not node-role.kubernetes.io/worker"],
  ["a label that only looks like ours", request(SA, "n1"), node("n1", base), node("n1", { ...base, "nvidia.com/gpu-evil": "1" }), "not nvidia.com/gpu-evil"],
  ["another annotation", request(SA, "n1"), node("n1", base), node("n1", base, { "node.alpha.kubernetes.io/ttl": "0" }), "only its annotation edgeaccel.io/managed-labels"],
  ["a taint", request(SA, "n1"), node("n1", base), node("n1", base, {}, { podCIDR: "10.0.0.0/24", taints: [{ key: "x", effect: "NoSchedule" }] }), "may not change a Node's spec"],
  ["cordoning", request(SA, "n1"), node("n1", base), node("n1", base, {}, { podCIDR: "10.0.0.0/24", unschedulable: true }), "may not change a Node's spec"],
];
// DRA (components/dra): the daemon's ResourceSlices, one per node and driver.
const slice = (nodeName, driver = "edgetpu.edgeaccel.io", where = { nodeName }) => ({
  apiVersion: "resource.k8s.io/v1", kind: "ResourceSlice",
  metadata: { name: `${nodeName ?? "all"}-${driver}-x7k2p` },
  spec: { driver, pool: { name: nodeName ?? "shared", generation: 1, resourceSliceCount: 1 }, ...where,
          devices: [{ name: "tpu-0000-03-00-0", attributes: { bus: { string: "pci" } } }] },
});
const create = (user, nodeName) => request(user, nodeName, "CREATE");
const remove = (user, nodeName) => request(user, nodeName, "DELETE");
const sliceCases = [
  ["creating our node's Edge TPU slice", create(SA, "n1"), null, slice("n1"), null],
  ["creating our node's GPU slice", create(SA, "n1"), null, slice("n1", "gpu.edgeaccel.io"), null],
  ["updating our node's slice", request(SA, "n1"), slice("n1"), slice("n1"), null],
  ["deleting our node's slice", remove(SA, "n1"), slice("n1"), null, null],
  ["the kubelet is not this policy's business", create("system:node:n2", "n2"), null, slice("n1", "x.example.com"), null],
  ["creating another node's slice", create(SA, "n1"), null, slice("n2"), "runs on (n1), not those of n2"],
  ["updating another node's slice", request(SA, "n1"), slice("n2"), slice("n2"), "runs on (n1), not those of n2"],
  ["deleting another node's slice", remove(SA, "n1"), slice("n2"), null, "runs on (n1), not those of n2"],
  ["a token that does not name the node", create(SA, null), null, slice("n1"), "its token does not say which"],
  ["a token without extra", create(SA, undefined), null, slice("n1"), "its token does not say which"],
  ["a slice for all nodes", create(SA, "n1"), null, slice(null, "edgetpu.edgeaccel.io", { allNodes: true }), "not one without spec.nodeName"],
  ["another driver's slice", create(SA, "n1"), null, slice("n1", "gpu.nvidia.com"), "its drivers (edgetpu.edgeaccel.io, gpu.edgeaccel.io), not of gpu.nvidia.com"],
  ["deleting another driver's slice", remove(SA, "n1"), slice("n1", "gpu.nvidia.com"), null, "not of gpu.nvidia.com"],
];

let failed = 0;
for (const policy of policies) {
  const name = policy.metadata.name;
  const binding = docs.find((d) => d.kind === "ValidatingAdmissionPolicyBinding" && d.spec.policyName === name);
  if (!binding || !binding.spec.validationActions.includes("Deny")) {
    console.error(`the policy ${name} has no binding that denies`);
    process.exit(1);
  }
  const resources = policy.spec.matchConstraints.resourceRules.flatMap((r) => r.resources);
  const cases = resources.includes("nodes") ? nodeCases : resources.includes("resourceslices") ? sliceCases : null;
  if (!cases) {
    console.error(`the policy ${name} is about ${resources.join(", ")}: no requests to try it on`);
    process.exit(1);
  }
  for (const [what, req, oldObject, object, want] of cases) {
    let got;
    try {
      got = admit(policy, req, oldObject, object);
    } catch (e) {
      got = `CEL error: ${e.message}`;
    }
    const ok = want === null ? got === null : typeof got === "string" && got.includes(want);
    if (!ok) {
      failed++;
      console.error(`FAIL ${name}: ${what}: want ${want === null ? "allowed" : `denied with "${want}"`}, got ${got === null ? "allowed" : `"${got}"`}`);
    }
  }
  if (!failed) console.log(`admission policy ${name}: ${cases.length} requests allowed or denied as they must be`);
}
if (failed) process.exit(1);
