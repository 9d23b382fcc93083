// Runs the ValidatingAdmissionPolicy's CEL (matchConditions, variables, validations) the way the
// API server evaluates them, on Node update requests from the daemon's service account, with a
// CEL interpreter (@marcbachmann/cel-js), offline: what must be allowed is, what must be denied
// is, and each denial says why.
// usage: node check-admission-policy.mjs FILE.yaml   (holds the policy, among other objects)
import { readFileSync } from "node:fs";
import yaml from "js-yaml";
import * as cel from "@marcbachmann/cel-js";

const docs = yaml.loadAll(readFileSync(process.argv[2], "utf8")).filter(Boolean);
const policy = docs.find((d) => d.kind === "ValidatingAdmissionPolicy");
if (!policy) {
  console.error(`${process.argv[2]}: no ValidatingAdmissionPolicy`);
  process.exit(1);
}
const binding = docs.find((d) => d.kind === "ValidatingAdmissionPolicyBinding");
if (!binding || binding.spec.policyName !== policy.metadata.name ||
    !binding.spec.validationActions.includes("Deny")) {
  console.error("the policy has no binding that denies");
  process.exit(1);
}

const SA = "system:serviceaccount:kube-system:edgeaccel-device-plugin";
const node = (name, labels, annotations = {}, spec = { podCIDR: "10.0.0.0/24" }) => ({
  apiVersion: "v1", kind: "Node", metadata: { name, labels, annotations }, spec,
});
const base = { "kubernetes.io/hostname": "n1", "node-role.kubernetes.io/worker": "" };
const request = (user, nodeName) => ({
  userInfo: {
    username: user,
    extra: nodeName ? { "authentication.kubernetes.io/node-name": [nodeName] } : {},
  },
});

// Evaluates the policy on one request; returns null (allowed or not matched) or the denial.
function admit(req, oldObject, object) {
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
const cases = [
  ["our labels and annotation on our own node", request(SA, "n1"), node("n1", base), node("n1", ours, managed), null],
  ["removing our labels", request(SA, "n1"), node("n1", ours, managed), node("n1", base, {}), null],
  ["seed labels (gpu.*)", request(SA, "n1"), node("n1", base), node("n1", { ...base, "gpu.model": "x" }), null],
  ["another user is not this policy's business", request("system:node:n2", "n2"), node("n1", base), node("n1", { ...base, "x/y": "1" }), null],
  ["another node", request(SA, "n1"), node("n2", base), node("n2", ours), "only the Node its pod runs on (n1), not n2"],
  ["a token that does not name the node", request(SA, null), node("n1", base), node("n1", ours), "its token does not say which"],
  ["someone else's label", request(SA, "n1"), node("n1", base), node("n1", { ...base, "node-role.kubernetes.io/control-plane": "" }), "not node-role.kubernetes.io/control-plane"],
  ["removing someone else's label", request(SA, "n1"), node("n1", base), node("n1", { "kubernetes.io/hostname": "n1" }), "not node-role.kubernetes.io/worker"],
  ["a label that only looks like ours", request(SA, "n1"), node("n1", base), node("n1", { ...base, "nvidia.com/gpu-evil": "1" }), "not nvidia.com/gpu-evil"],
  ["another annotation", request(SA, "n1"), node("n1", base), node("n1", base, { "node.alpha.kubernetes.io/ttl": "0" }), "only its annotation edgeaccel.io/managed-labels"],
  ["a taint", request(SA, "n1"), node("n1", base), node("n1", base, {}, { podCIDR: "10.0.0.0/24", taints: [{ key: "x", effect: "NoSchedule" }] }), "may not change a Node's spec"],
  ["cordoning", request(SA, "n1"), node("n1", base), node("n1", base, {}, { podCIDR: "10.0.0.0/24", unschedulable: true }), "may not change a Node's spec"],
];
let failed = 0;
for (const [what, req, oldObject, object, want] of cases) {
  let got;
  try {
    got = admit(req, oldObject, object);
  } catch (e) {
    got = `CEL error: ${e.message}`;
  }
  const ok = want === null ? got === null : typeof got === "string" && got.includes(want);
  if (!ok) {
    failed++;
    console.error(`FAIL ${what}: want ${want === null ? "allowed" : `denied with "${want}"`}, got ${got === null ? "allowed" : `"${got}"`}`);
  }
}
if (failed) process.exit(1);
console.log(`admission policy: ${cases.length} requests allowed or denied as they must be`);
