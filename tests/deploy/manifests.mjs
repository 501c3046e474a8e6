// The deployment files as data, shared by validate_test.mjs and commands.mjs: every YAML document of
// deploy/kubernetes/*.yaml, and the Dockerfile's ENTRYPOINT, CMD and ENV.
import fs from "node:fs";
import path from "node:path";
import { skipForMissingDependency } from "../missing_dependency.mjs";

// Exits 77 (CTest's skip) when the npm packages are not installed, saying how to get them.
export async function importOrSkip(name) {
  try {
    return await import(name);
  } catch (e) {
    skipForMissingDependency(`npm package '${name}' is not installed in tests/deploy (run ./dev setup): ${e.message}`);
  }
}

// [{file, index, doc}] for every non-empty document of every .yaml file under deploy/kubernetes.
export async function loadManifests(root) {
  const YAML = await importOrSkip("yaml");
  const dir = path.join(root, "deploy", "kubernetes");
  const out = [];
  for (const name of fs.readdirSync(dir).filter((n) => n.endsWith(".yaml")).sort()) {
    const file = path.join("deploy", "kubernetes", name);
    const docs = YAML.parseAllDocuments(fs.readFileSync(path.join(root, file), "utf8"));
    docs.forEach((d, index) => {
      if (d.errors.length > 0) throw new Error(`${file} document ${index + 1}: ${d.errors[0].message}`);
      const doc = d.toJS();
      if (doc !== null && doc !== undefined) out.push({ file, index, doc });
    });
  }
  return out;
}

// The Dockerfile's final stage: {entrypoint, cmd, env} (exec-form JSON arrays only: the shell form would hide the
// command line from the tests, so it is an error).
export function loadDockerfile(root) {
  const text = fs.readFileSync(path.join(root, "Dockerfile"), "utf8").replace(/\\\n/g, " ");
  let stage = null;
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    const m = /^(FROM|ENTRYPOINT|CMD|ENV)\s+(.*)$/i.exec(line);
    if (!m) continue;
    const [, keyword, rest] = m;
    const k = keyword.toUpperCase();
    if (k === "FROM") {
      stage = { from: rest, entrypoint: [], cmd: [], env: {} };
    } else if (k === "ENV") {
      for (const pair of rest.split(/\s+/)) {
        const eq = pair.indexOf("=");
        if (eq > 0) stage.env[pair.slice(0, eq)] = pair.slice(eq + 1);
      }
    } else {
      if (!rest.startsWith("[")) throw new Error(`Dockerfile: ${k} must be in exec form (a JSON array): ${line}`);
      stage[k.toLowerCase()] = JSON.parse(rest);
    }
  }
  if (stage === null) throw new Error("Dockerfile: no FROM");
  return stage;
}
