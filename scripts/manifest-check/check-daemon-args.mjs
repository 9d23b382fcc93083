// Runs the real daemon on what each rendered DaemonSet would start it with: the device-plugin
// container's args, and its env as the kubelet would set it (a fieldRef to spec.nodeName becomes
// a node name), through `edgeaccel-device-plugin --check-config`, which parses and checks every
// flag as a start on a node does but reads nothing of the host. A render whose arguments the
// daemon refuses would crash-loop on every node: it fails here, with the daemon's own message.
// Also refused: a pod spec the API server refuses on create (two volumes of one name, two mounts
// at one path), which a component that adds a volume another one adds as well can render.
//
// usage: node check-daemon-args.mjs DAEMON FILE.yaml...   (prints one line per render)
import { readFileSync } from "node:fs";
import { spawnSync } from "node:child_process";
import { basename } from "node:path";
import yaml from "js-yaml";

const [daemon, ...files] = process.argv.slice(2);
if (!daemon || files.length === 0) {
  console.error("usage: node check-daemon-args.mjs DAEMON FILE.yaml...");
  process.exit(2);
}

const NODE_NAME = "node-1";
let failed = 0;
let checked = 0;

// The env a container gets: literal values, and the downward API's node name.
function containerEnv(container, where) {
  const env = { PATH: process.env.PATH };
  for (const entry of container.env ?? []) {
    if (entry.value !== undefined) {
      env[entry.name] = String(entry.value);
    } else if (entry.valueFrom?.fieldRef?.fieldPath === "spec.nodeName") {
      env[entry.name] = NODE_NAME;
    } else {
      throw new Error(`${where}: env ${entry.name}: a source this check does not model`);
    }
  }
  return env;
}

function duplicates(list, key) {
  const seen = new Set();
  const out = [];
  for (const item of list ?? []) {
    if (seen.has(item[key])) out.push(item[key]);
    seen.add(item[key]);
  }
  return out;
}

for (const file of files) {
  const docs = yaml.loadAll(readFileSync(file, "utf8")).filter(Boolean);
  const sets = docs.filter((d) => d.kind === "DaemonSet");
  if (sets.length === 0) {
    console.log(`FAIL ${file}: no DaemonSet`);
    ++failed;
    continue;
  }
  for (const set of sets) {
    const where = `${basename(file)} ${set.metadata?.name}`;
    const spec = set.spec.template.spec;
    const problems = [];
    for (const name of duplicates(spec.volumes, "name")) problems.push(`volume ${name} twice`);
    for (const container of spec.containers) {
      for (const path of duplicates(container.volumeMounts, "mountPath")) {
        problems.push(`container ${container.name} mounts ${path} twice`);
      }
    }
    const container = spec.containers.find((c) => c.name === "device-plugin") ?? spec.containers[0];
    let result;
    try {
      result = spawnSync(daemon, ["--check-config", ...(container.command?.slice(1) ?? []), ...(container.args ?? [])], {
        env: containerEnv(container, where),
        encoding: "utf8",
        timeout: 20000,
      });
    } catch (e) {
      problems.push(String(e.message));
    }
    ++checked;
    if (result && result.status !== 0) {
      problems.push(`the daemon exits ${result.status ?? result.signal} on its arguments ` +
                    `${JSON.stringify(container.args)}: ${(result.stderr || result.stdout).trim()}`);
    }
    if (problems.length > 0) {
      ++failed;
      console.log(`FAIL ${where}: ${problems.join("; ")}`);
    } else {
      const notes = (result.stdout.match(/^  note: .*/gm) ?? []).map((n) => n.trim());
      console.log(`ok   ${where}${notes.length ? ` (${notes.join("; ")})` : ""}`);
    }
  }
}
console.log(`${checked} rendered DaemonSet(s) started with --check-config, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
