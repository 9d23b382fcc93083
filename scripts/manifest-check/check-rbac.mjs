// Holds the install's API rights to docs/rbac.md, the table of every right with the request that
// needs it and the source file that sends it:
//  1. every rule of every Role and ClusterRole of each render grants only what a row lists (API
//     group, resource, verb), in the row's scope (cluster: a ClusterRole; namespace N: a Role in
//     N), with no wildcard and no nonResourceURLs; with --complete, every row is granted;
//  2. every binding binds a role of the render to a ServiceAccount of the render (a binding to
//     a role the install does not define, or to a user or group, would grant what no row shows);
//  3. an identity that may patch or update Nodes has the own-node ValidatingAdmissionPolicy
//     (UPDATE on nodes, matching its username) with a binding that denies: RBAC cannot narrow
//     patch to one Node, the policy can. --allow-patching-any-node accepts a render without it
//     (components/allow-patching-any-node, chart nodeLabels.allowPatchingAnyNode);
//  4. with --source DIR: every Request("METHOD", ...) in DIR's .cc files is a row's method in a
//     file that row names, every row's file still sends its method, and each row's verb is the
//     one its request needs (GET of a name: get; GET of a collection: list; POST: create; PUT:
//     update; PATCH: patch; DELETE: delete); a file that calls ApiClient::OpenWatch sends a GET
//     with watch=true.
// Each FILE is one install (a `kubectl kustomize` or `helm template` output), checked on its own.
// usage: node check-rbac.mjs [--table docs/rbac.md] [--source src] [--complete]
//                            [--allow-patching-any-node] FILE.yaml...
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import yaml from "js-yaml";

const args = process.argv.slice(2);
const flag = (name) => {
  const i = args.indexOf(name);
  if (i < 0) return false;
  args.splice(i, 1);
  return true;
};
const option = (name, fallback) => {
  const i = args.indexOf(name);
  if (i < 0) return fallback;
  const [, value] = args.splice(i, 2);
  return value;
};
const tableFile = option("--table", new URL("../../docs/rbac.md", import.meta.url).pathname);
const sourceDir = option("--source", null);
const complete = flag("--complete");
const allowPatchingAnyNode = flag("--allow-patching-any-node");
const files = args;

const failures = [];
const fail = (where, what) => failures.push(`${where}: ${what}`);

// The table: the one whose header starts "| API group | resource | verb |".
function readTable(file) {
  const lines = readFileSync(file, "utf8").split("\n");
  const start = lines.findIndex((l) => /^\|\s*API group\s*\|\s*resource\s*\|\s*verb\s*\|/.test(l));
  if (start < 0) throw new Error(`${file}: no table headed "| API group | resource | verb | ..."`);
  const rows = [];
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith("|")) break;
    const cells = line.split("|").slice(1, -1).map((c) => c.trim());
    const code = (cell) => (cell.match(/`([^`]*)`/) || [])[1];
    const group = code(cells[0]);
    const scope = cells[3].startsWith("cluster") ? "cluster"
      : (cells[3].match(/^namespace\s+`?([a-z0-9-]+)`?/) || [])[1];
    const request = code(cells[4]) || "";
    const row = {
      group: group === '""' ? "" : group, resource: code(cells[1]), verb: code(cells[2]),
      scope: scope === "cluster" ? scope : scope && `namespace ${scope}`,
      method: request.split(" ")[0], path: request.split(" ")[1] || "",
      files: [...new Set(cells[5].match(/src\/[\w/.-]+\.cc/g) || [])], line,
    };
    if (row.group === undefined || !row.resource || !row.verb || !row.scope || !row.method) {
      throw new Error(`${file}: a row without API group, resource, verb, scope or request: ${line}`);
    }
    rows.push(row);
  }
  return rows;
}
const table = readTable(tableFile);
const rowsFor = (group, resource, verb) =>
  table.filter((r) => r.group === group && r.resource === resource && r.verb === verb);
const show = (group, resource, verb) => `${verb} on ${group === "" ? "core" : group} ${resource}`;

const NODE_WRITES = ["patch", "update"];

function checkInstall(file) {
  const docs = yaml.loadAll(readFileSync(file, "utf8")).filter((d) => d != null);
  const roles = new Map();  // "ClusterRole/name" or "Role/ns/name" -> role
  const accounts = new Set(docs.filter((d) => d.kind === "ServiceAccount")
    .map((d) => `${d.metadata.namespace}:${d.metadata.name}`));
  const granted = new Set();
  for (const role of docs.filter((d) => d.kind === "ClusterRole" || d.kind === "Role")) {
    const cluster = role.kind === "ClusterRole";
    const id = cluster ? `ClusterRole/${role.metadata.name}` : `Role/${role.metadata.namespace}/${role.metadata.name}`;
    roles.set(id, role);
    const where = `${file}: ${id}`;
    if (cluster && role.aggregationRule) fail(where, "an aggregated ClusterRole grants what other roles add to it");
    const scope = cluster ? "cluster" : `namespace ${role.metadata.namespace}`;
    for (const rule of role.rules || []) {
      if (rule.nonResourceURLs) fail(where, `grants nonResourceURLs ${rule.nonResourceURLs.join(", ")}, which no call needs`);
      for (const [field, list] of [["apiGroups", rule.apiGroups], ["resources", rule.resources], ["verbs", rule.verbs]]) {
        if ((list || []).some((x) => x.includes("*"))) fail(where, `a wildcard in ${field} grants what no call needs`);
      }
      for (const group of rule.apiGroups || []) {
        for (const resource of rule.resources || []) {
          for (const verb of rule.verbs || []) {
            if (group.includes("*") || resource.includes("*") || verb.includes("*")) continue;
            const rows = rowsFor(group, resource, verb);
            if (!rows.length) {
              fail(where, `grants ${show(group, resource, verb)}, which no call in docs/rbac.md needs`);
            } else if (!rows.some((r) => r.scope === scope)) {
              fail(where, `grants ${show(group, resource, verb)} in ${cluster ? "every namespace" : scope}; ` +
                          `docs/rbac.md needs it in ${rows.map((r) => r.scope).join(", ")} only`);
            } else {
              granted.add(`${group}/${resource}/${verb}/${scope}`);
            }
          }
        }
      }
    }
  }
  if (complete) {
    for (const r of table) {
      if (!granted.has(`${r.group}/${r.resource}/${r.verb}/${r.scope}`)) {
        fail(file, `no role grants ${show(r.group, r.resource, r.verb)} (${r.scope}), which ${r.method} ${r.path} needs`);
      }
    }
  }

  // Who may write Nodes: the subjects of ClusterRoleBindings whose role grants patch or update
  // on them (a RoleBinding grants nothing on cluster-scoped objects).
  const nodeWriters = new Map();  // username -> the role that lets it
  for (const binding of docs.filter((d) => d.kind === "ClusterRoleBinding" || d.kind === "RoleBinding")) {
    const where = `${file}: ${binding.kind}/${binding.metadata.name}`;
    const ref = binding.roleRef || {};
    const id = ref.kind === "ClusterRole" ? `ClusterRole/${ref.name}` : `Role/${binding.metadata.namespace}/${ref.name}`;
    const role = roles.get(id);
    if (!role) fail(where, `binds ${id}, which this install does not define (so docs/rbac.md cannot vouch for it)`);
    for (const s of binding.subjects || []) {
      if (s.kind !== "ServiceAccount" || !accounts.has(`${s.namespace}:${s.name}`)) {
        fail(where, `binds ${s.kind} ${s.namespace ? `${s.namespace}/` : ""}${s.name}, not this install's ServiceAccount`);
        continue;
      }
      if (!role || binding.kind !== "ClusterRoleBinding") continue;
      const writes = (role.rules || []).some((r) =>
        (r.apiGroups || []).some((g) => g === "" || g === "*") &&
        (r.resources || []).some((x) => x === "nodes" || x === "*") &&
        (r.verbs || []).some((v) => NODE_WRITES.includes(v) || v === "*"));
      if (writes) nodeWriters.set(`system:serviceaccount:${s.namespace}:${s.name}`, id);
    }
  }
  const bindings = docs.filter((d) => d.kind === "ValidatingAdmissionPolicyBinding");
  for (const [user, role] of nodeWriters) {
    const guarded = docs.some((p) => p.kind === "ValidatingAdmissionPolicy" &&
      (p.spec.failurePolicy ?? "Fail") === "Fail" &&
      (p.spec.matchConstraints?.resourceRules || []).some((r) =>
        (r.apiGroups || []).some((g) => g === "" || g === "*") &&
        (r.resources || []).some((x) => x === "nodes" || x === "*") &&
        (r.operations || []).some((o) => o === "UPDATE" || o === "*")) &&
      (p.spec.matchConditions || []).every((c) => c.expression.includes(`'${user}'`)) &&
      (p.spec.validations || []).length > 0 &&
      bindings.some((b) => b.spec.policyName === p.metadata.name && (b.spec.validationActions || []).includes("Deny") &&
        !b.spec.matchResources && !b.spec.paramRef));
    if (guarded) continue;
    if (allowPatchingAnyNode) {
      console.log(`${file}: ${user} may patch every Node (${role}), as --allow-patching-any-node accepts`);
    } else {
      fail(file, `${user} may patch every Node (${role}: taint, cordon, relabel any of them) and no ` +
                 "ValidatingAdmissionPolicy that denies holds it to its own (components/admission-policy, " +
                 "chart admissionPolicy.enabled); to accept that, components/allow-patching-any-node or " +
                 "nodeLabels.allowPatchingAnyNode=true");
    }
  }
  return docs.filter((d) => d.kind === "ClusterRole" || d.kind === "Role").length;
}

// The source side: the requests the code sends, against the rows that grant them.
function sourceFiles(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? sourceFiles(path) : path.endsWith(".cc") ? [path] : [];
  });
}
// Whether FILE (src/LAYER/NAME.cc) or its own header (include/edgeaccel/LAYER/NAME.h) includes
// node/api_client.h.
function seesApiClient(dir, file, text) {
  const includesClient = (t) => /#include\s+"edgeaccel\/node\/api_client\.h"/.test(t);
  if (includesClient(text)) return true;
  const header = join(dir, "..", "include", "edgeaccel", relative(dir, file).replace(/\.cc$/, ".h"));
  try {
    return includesClient(readFileSync(header, "utf8"));
  } catch {
    return false;
  }
}
function verbFor(method, path) {
  if (method === "GET") {
    if (/[?&]watch=(true|1)/.test(path)) return "watch";
    return /\/<[^/>]+>$/.test(path.split("?")[0]) ? "get" : "list";
  }
  if (method === "DELETE" && !/\/<[^/>]+>$/.test(path)) return "deletecollection";
  return { POST: "create", PUT: "update", PATCH: "patch", DELETE: "delete" }[method];
}
function checkSource(dir) {
  const before = failures.length;
  const sent = new Map();  // file -> Set of methods
  const watching = new Set();  // files that start a watch (ApiClient::OpenWatch: a GET with watch=true)
  for (const file of sourceFiles(dir)) {
    const text = readFileSync(file, "utf8");
    const rel = join("src", relative(dir, file));  // as docs/rbac.md names it
    const methods = [...text.matchAll(/\bRequest\(\s*"([A-Z]+)"/g)].map((m) => m[1]);
    // A file starts an API watch only where it, or the header of the same name, includes the
    // ApiClient (the daemon has other watches: HostWatches::Watch is inotify).
    if (/(->|\.)OpenWatch\(/.test(text) && seesApiClient(dir, file, text)) {
      watching.add(rel);
      methods.push("GET");
    }
    if (!methods.length) continue;
    if (!sent.has(rel)) sent.set(rel, new Set());
    for (const method of methods) sent.get(rel).add(method);
  }
  for (const [file, methods] of sent) {
    for (const method of methods) {
      if (!table.some((r) => r.method === method && r.files.includes(file))) {
        fail("docs/rbac.md", `${file} sends ${method}, and no row names that file and method: ` +
                             "add the row (and the right to the roles), or the call is refused with 403");
      }
    }
  }
  let rows = 0;
  for (const r of table) {
    rows++;
    const want = verbFor(r.method, r.path);
    if (want !== r.verb) fail("docs/rbac.md", `${r.method} ${r.path} needs ${want}, the row says ${r.verb}`);
    if (!r.files.length) fail("docs/rbac.md", `the row for ${r.method} ${r.path} names no source file`);
    for (const file of r.files) {
      if (r.verb === "watch" && !watching.has(file)) {
        fail("docs/rbac.md", `${file} starts no watch any more, yet the row for ${show(r.group, r.resource, r.verb)} ` +
                             "names it: remove the row (and the right), or name the file that watches");
      }
      if (!sent.get(file)?.has(r.method)) {
        fail("docs/rbac.md", `${file} sends no ${r.method} any more, yet the row for ${show(r.group, r.resource, r.verb)} ` +
                             "names it: remove the row (and the right), or name the file that sends it");
      }
    }
  }
  if (failures.length > before) return;
  console.log(`docs/rbac.md: ${rows} rights, each sent from the files it names; ` +
              `${[...sent.values()].reduce((n, s) => n + s.size, 0)} method(s) in ${sent.size} file(s) of ${dir}, each in a row`);
}

if (sourceDir) checkSource(sourceDir);
for (const file of files) {
  const before = failures.length;
  const n = checkInstall(file);
  if (failures.length === before) {
    console.log(`${file}: ${n} role(s), every right in docs/rbac.md${complete ? ", and every row of it granted" : ""}`);
  }
}
if (failures.length) {
  console.error(failures.join("\n"));
  console.error(`${failures.length} problem(s)`);
  process.exit(1);
}
