// Writes a deliberately broken copy of a render, for the checks to refuse (check-manifests.sh):
// runs BODY, JavaScript, on `docs` (the render's objects) and writes what it leaves.
// usage: node tamper.mjs IN.yaml OUT.yaml 'BODY'
import { readFileSync, writeFileSync } from "node:fs";
import yaml from "js-yaml";

const [input, output, body] = process.argv.slice(2);
const docs = yaml.loadAll(readFileSync(input, "utf8")).filter(Boolean);
new Function("docs", body)(docs);
writeFileSync(output, docs.map((d) => yaml.dump(d)).join("---\n"));
