// Compares two renders object by object, field by field: every object of the first (kind and
// name; e.g. `kubectl kustomize` output) must be in the second (e.g. `helm template` output) and
// equal to it, except for the labels Helm adds to an object's own metadata (chart, instance,
// version, managed-by), and the order of lists Kubernetes keys by name (volumes, env, ...).
// Prints each differing path.
// usage: node compare.mjs EXPECTED.yaml ACTUAL.yaml [KIND...]   (only those kinds, if given)
import { readFileSync } from "node:fs";
import yaml from "js-yaml";

const load = (file) => yaml.loadAll(readFileSync(file, "utf8")).filter(Boolean);
const [expectedFile, actualFile, ...kinds] = process.argv.slice(2);
const HELM_LABELS = ["helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                     "app.kubernetes.io/managed-by"];
const key = (o) => `${o.kind}/${o.metadata.namespace ?? ""}/${o.metadata.name}`;
const actual = new Map(load(actualFile).map((o) => [key(o), o]));
const differences = [];
const byName = (list) => list.length > 0 && list.every((x) => x && typeof x === "object" && typeof x.name === "string") &&
  new Set(list.map((x) => x.name)).size === list.length;
function diff(path, a, b) {
  if (typeof a !== typeof b || Array.isArray(a) !== Array.isArray(b) || (a === null) !== (b === null)) {
    differences.push(`${path}: ${JSON.stringify(a)} != ${JSON.stringify(b)}`);
  } else if (Array.isArray(a) && byName(a) && byName(b)) {
    // A list Kubernetes keys by name (volumes, containers, env, ports): its order is not meant.
    const am = new Map(a.map((x) => [x.name, x]));
    const bm = new Map(b.map((x) => [x.name, x]));
    for (const name of new Set([...am.keys(), ...bm.keys()])) {
      if (!am.has(name)) differences.push(`${path}[name=${name}]: missing from the first`);
      else if (!bm.has(name)) differences.push(`${path}[name=${name}]: missing from the second`);
      else diff(`${path}[name=${name}]`, am.get(name), bm.get(name));
    }
  } else if (Array.isArray(a)) {
    if (a.length !== b.length) differences.push(`${path}: ${a.length} items != ${b.length} items`);
    for (let i = 0; i < Math.min(a.length, b.length); i++) diff(`${path}[${i}]`, a[i], b[i]);
  } else if (a !== null && typeof a === "object") {
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
      if (!(k in a)) differences.push(`${path}.${k}: missing from the first, ${JSON.stringify(b[k])} in the second`);
      else if (!(k in b)) differences.push(`${path}.${k}: ${JSON.stringify(a[k])} in the first, missing from the second`);
      else diff(`${path}.${k}`, a[k], b[k]);
    }
  } else if (a !== b) {
    differences.push(`${path}: ${JSON.stringify(a)} != ${JSON.stringify(b)}`);
  }
}
let compared = 0;
for (const want of load(expectedFile)) {
  if (kinds.length && !kinds.includes(want.kind)) continue;
  const got = structuredClone(actual.get(key(want)) ?? null);
  if (!got) {
    differences.push(`${key(want)}: not in ${actualFile}`);
    continue;
  }
  for (const label of HELM_LABELS) delete got.metadata?.labels?.[label];
  diff(key(want), want, got);
  compared++;
}
if (differences.length) {
  for (const d of differences) console.error(d);
  console.error(`${differences.length} difference(s) between ${expectedFile} and ${actualFile}`);
  process.exit(1);
}
console.log(`${compared} object(s) of ${expectedFile} equal in ${actualFile}`);
