// Every manifest under deploy/kubernetes validated against the Kubernetes API schemas with kubernetes-models (pinned in
// package.json; installed by ./dev setup), plus the properties docs/deploy.md promises of them. Exits 77 (skipped)
// when the npm packages are not installed. Usage: node validate_test.mjs REPO_ROOT
import assert from "node:assert/strict";
import { importOrSkip, loadManifests } from "./manifests.mjs";

const root = process.argv[2];
const models = {
  "v1/Secret": ["kubernetes-models/v1/Secret", "Secret"],
  "v1/Service": ["kubernetes-models/v1/Service", "Service"],
  "v1/PersistentVolumeClaim": ["kubernetes-models/v1/PersistentVolumeClaim", "PersistentVolumeClaim"],
  "apps/v1/Deployment": ["kubernetes-models/apps/v1/Deployment", "Deployment"],
  "policy/v1/PodDisruptionBudget": ["kubernetes-models/policy/v1/PodDisruptionBudget", "PodDisruptionBudget"],
};

const manifests = await loadManifests(root);
let failures = 0;
const byName = {};
for (const { file, index, doc } of manifests) {
  const where = `${file} #${index + 1} (${doc.kind} ${doc.metadata?.name})`;
  const entry = models[`${doc.apiVersion}/${doc.kind}`];
  if (!entry) {
    console.error(`FAIL ${where}: no schema for ${doc.apiVersion} ${doc.kind} in this test's table`);
    failures++;
    continue;
  }
  const Model = (await importOrSkip(entry[0]))[entry[1]];
  try {
    new Model(doc).validate();
    console.log(`ok   ${where}`);
  } catch (e) {
    console.error(`FAIL ${where}: ${e.message}`);
    failures++;
  }
  byName[`${doc.kind}/${doc.metadata.name}/${file}`] = doc;
}

// What docs/deploy.md says of them.
function find(kind, name, fileEnd) {
  const key = Object.keys(byName).find((k) => k.startsWith(`${kind}/${name}/`) && k.endsWith(fileEnd));
  assert.ok(key, `${kind} ${name} in ${fileEnd}`);
  return byName[key];
}
function container(deployment) {
  return deployment.spec.template.spec.containers[0];
}
const checks = [
  ["the PostgreSQL coordinator has 2 replicas, rolls one at a time", () => {
    const d = find("Deployment", "parsyn-coordinator", "coordinator-postgres.yaml");
    assert.equal(d.spec.replicas, 2);
    assert.equal(d.spec.strategy.rollingUpdate.maxUnavailable, 0);
  }],
  ["the SQLite coordinator has 1 replica on a PVC, recreated", () => {
    const d = find("Deployment", "parsyn-coordinator", "coordinator-sqlite.yaml");
    assert.equal(d.spec.replicas, 1);
    assert.equal(d.spec.strategy.type, "Recreate");
    assert.ok(d.spec.template.spec.volumes.some((v) => v.persistentVolumeClaim?.claimName === "parsyn-data"));
    find("PersistentVolumeClaim", "parsyn-data", "coordinator-sqlite.yaml");
  }],
  ["coordinators probe /healthz (liveness) and /readyz (readiness), request resources, run as non-root", () => {
    for (const f of ["coordinator-postgres.yaml", "coordinator-sqlite.yaml"]) {
      const d = find("Deployment", "parsyn-coordinator", f);
      const c = container(d);
      assert.equal(c.livenessProbe.httpGet.path, "/healthz", f);
      assert.equal(c.readinessProbe.httpGet.path, "/readyz", f);
      assert.ok(c.resources.requests.cpu && c.resources.requests.memory, f);
      assert.equal(d.spec.template.spec.securityContext.runAsNonRoot, true, f);
      assert.equal(d.spec.template.metadata.annotations["prometheus.io/scrape"], "true", f);
      assert.equal(d.spec.template.metadata.annotations["prometheus.io/path"], "/metrics", f);
    }
  }],
  ["the PostgreSQL coordinator takes its store and S3 credentials from Secrets", () => {
    const env = container(find("Deployment", "parsyn-coordinator", "coordinator-postgres.yaml")).env;
    const from = Object.fromEntries(env.map((e) => [e.name, e.valueFrom?.secretKeyRef?.name]));
    assert.equal(from.PARSYN_METADATA, "parsyn-postgres");
    assert.equal(from.PARSYN_BLOBS, "parsyn-s3");
    assert.equal(from.AWS_SECRET_ACCESS_KEY, "parsyn-s3");
  }],
  ["workers request one GPU each and register with the bootstrap Secret", () => {
    const d = find("Deployment", "parsyn-worker", "workers.yaml");
    const c = container(d);
    assert.equal(String(c.resources.requests["nvidia.com/gpu"]), "1");
    assert.equal(String(c.resources.limits["nvidia.com/gpu"]), "1");
    assert.ok(c.args.some((a) => a.startsWith("--bootstrap-key-file=")));
    assert.ok(d.spec.template.spec.volumes.some((v) => v.secret?.secretName === "parsyn-worker-bootstrap"));
  }],
  ["the Service names its port for a ServiceMonitor and carries the scrape annotations", () => {
    const s = find("Service", "parsyn-coordinator", "coordinator-service.yaml");
    assert.equal(s.spec.ports[0].name, "http");
    assert.equal(s.metadata.annotations["prometheus.io/scrape"], "true");
  }],
  ["PodDisruptionBudgets keep a coordinator and drain workers one at a time", () => {
    assert.equal(find("PodDisruptionBudget", "parsyn-coordinator", "pdb.yaml").spec.minAvailable, 1);
    assert.equal(find("PodDisruptionBudget", "parsyn-worker", "pdb.yaml").spec.maxUnavailable, 1);
  }],
  ["every Secret a workload names is in secrets.example.yaml, with every key it reads", () => {
    const secrets = {};
    for (const { file, doc } of manifests) {
      if (doc.kind === "Secret" && file.endsWith("secrets.example.yaml")) {
        secrets[doc.metadata.name] = Object.keys(doc.stringData);
      }
    }
    for (const { file, doc } of manifests) {
      if (doc.kind !== "Deployment") continue;
      const spec = doc.spec.template.spec;
      for (const v of spec.volumes ?? []) {
        if (v.secret) assert.ok(secrets[v.secret.secretName], `${file}: Secret ${v.secret.secretName}`);
      }
      for (const c of spec.containers) {
        for (const e of c.env ?? []) {
          const ref = e.valueFrom?.secretKeyRef;
          if (ref) assert.ok(secrets[ref.name]?.includes(ref.key), `${file}: Secret ${ref.name} key ${ref.key}`);
        }
      }
    }
  }],
];
for (const [name, check] of checks) {
  try {
    check();
    console.log(`ok   ${name}`);
  } catch (e) {
    console.error(`FAIL ${name}: ${e.message}`);
    failures++;
  }
}
console.log(`${manifests.length + checks.length - failures} passed, ${failures} failed`);
process.exit(failures === 0 ? 0 : 1);
