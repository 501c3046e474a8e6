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
  "networking.k8s.io/v1/NetworkPolicy": ["kubernetes-models/networking.k8s.io/v1/NetworkPolicy", "NetworkPolicy"],
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
const coordinatorFiles = ["coordinator-postgres.yaml", "coordinator-sqlite.yaml"];
// The value of --flag=VALUE in the container's command line (undefined when absent).
function flag(c, name) {
  const arg = [...(c.command ?? []), ...(c.args ?? [])].find((a) => a.startsWith(`${name}=`));
  return arg?.slice(name.length + 1);
}
// The Secret mounted at the folder holding `file` in the deployment's pod (undefined when none is).
function secretOf(deployment, file) {
  const spec = deployment.spec.template.spec;
  const mount = container(deployment).volumeMounts.find((m) => file.startsWith(`${m.mountPath}/`));
  return spec.volumes.find((v) => v.name === mount?.name)?.secret?.secretName;
}
// Whether a podSelector (a NetworkPolicy's, or a peer's) selects the pods of `deployment` (matchLabels only).
function selects(podSelector, deployment) {
  const labels = deployment.spec.template.metadata.labels;
  const want = podSelector?.matchLabels ?? {};
  return Object.keys(want).length > 0 && Object.entries(want).every(([k, v]) => labels[k] === v);
}
// The container port named `name` (or numbered) of the deployment's container.
function portNumber(deployment, port) {
  if (typeof port === "number") return port;
  return container(deployment).ports.find((p) => p.name === port)?.containerPort;
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
  ["coordinators probe /healthz and /readyz over HTTPS, request resources, run as non-root, are scraped", () => {
    for (const f of coordinatorFiles) {
      const d = find("Deployment", "parsyn-coordinator", f);
      const c = container(d);
      assert.equal(c.livenessProbe.httpGet.path, "/healthz", f);
      assert.equal(c.readinessProbe.httpGet.path, "/readyz", f);
      assert.equal(c.livenessProbe.httpGet.scheme, "HTTPS", f);
      assert.equal(c.readinessProbe.httpGet.scheme, "HTTPS", f);
      assert.ok(c.resources.requests.cpu && c.resources.requests.memory, f);
      assert.equal(d.spec.template.spec.securityContext.runAsNonRoot, true, f);
      assert.equal(d.spec.template.metadata.annotations["prometheus.io/scrape"], "true", f);
      assert.equal(d.spec.template.metadata.annotations["prometheus.io/path"], "/metrics", f);
      assert.equal(d.spec.template.metadata.annotations["prometheus.io/scheme"], "https", f);
    }
  }],
  ["coordinators serve HTTPS with the certificate of the parsyn-tls Secret, never --insecure", () => {
    for (const f of coordinatorFiles) {
      const d = find("Deployment", "parsyn-coordinator", f);
      const c = container(d);
      const cert = flag(c, "--tls-cert"), key = flag(c, "--tls-key");
      assert.ok(cert && key, `${f}: --tls-cert= and --tls-key=`);
      assert.equal(secretOf(d, cert), "parsyn-tls", `${f}: --tls-cert from the parsyn-tls Secret`);
      assert.equal(secretOf(d, key), "parsyn-tls", `${f}: --tls-key from the parsyn-tls Secret`);
      const publicUrl = flag(c, "--public-url");
      if (publicUrl !== undefined) assert.ok(publicUrl.startsWith("https://"), `${f}: --public-url ${publicUrl}`);
    }
    for (const { file, doc } of manifests) {
      for (const c of doc.spec?.template?.spec?.containers ?? []) {
        const argv = [...(c.command ?? []), ...(c.args ?? [])];
        assert.ok(!argv.some((a) => a === "--insecure" || a.startsWith("--insecure=")), `${file}: --insecure`);
      }
    }
  }],
  ["workers reach the coordinator over https and trust its CA from the parsyn-ca Secret", () => {
    const d = find("Deployment", "parsyn-worker", "workers.yaml");
    const c = container(d);
    const server = flag(c, "--server");
    assert.ok(server?.startsWith("https://parsyn-coordinator:"), `--server=${server}`);
    const ca = flag(c, "--ca-file");
    assert.ok(ca, "--ca-file=");
    assert.equal(secretOf(d, ca), "parsyn-ca", "--ca-file from the parsyn-ca Secret");
  }],
  ["NetworkPolicies: coordinators take only their API port, workers nothing; egress to DNS, the coordinator", () => {
    const coordinatorPolicy = find("NetworkPolicy", "parsyn-coordinator", "networkpolicy.yaml");
    const workerPolicy = find("NetworkPolicy", "parsyn-worker", "networkpolicy.yaml");
    const worker = find("Deployment", "parsyn-worker", "workers.yaml");
    for (const p of [coordinatorPolicy, workerPolicy]) {
      assert.deepEqual([...p.spec.policyTypes].sort(), ["Egress", "Ingress"], p.metadata.name);
      const dns = p.spec.egress.some((r) => !r.to && r.ports?.some((q) => q.port === 53 && q.protocol === "UDP"));
      assert.ok(dns, `${p.metadata.name}: DNS egress`);
    }
    for (const f of coordinatorFiles) {
      const d = find("Deployment", "parsyn-coordinator", f);
      assert.ok(selects(coordinatorPolicy.spec.podSelector, d), `parsyn-coordinator selects the pods of ${f}`);
      assert.ok(!selects(workerPolicy.spec.podSelector, d), `parsyn-worker does not select the pods of ${f}`);
      const api = portNumber(d, container(d).readinessProbe.httpGet.port);
      assert.ok(coordinatorPolicy.spec.ingress.length > 0, "coordinator ingress rules");
      for (const rule of coordinatorPolicy.spec.ingress) {
        assert.deepEqual(rule.ports.map((q) => portNumber(d, q.port)), [api], `${f}: ingress only on port ${api}`);
      }
      assert.ok(
        coordinatorPolicy.spec.ingress.some((r) => r.from.some((peer) => selects(peer.podSelector, worker))),
        "coordinators accept the worker pods",
      );
      assert.ok(
        workerPolicy.spec.egress.some(
          (r) => r.to?.some((peer) => selects(peer.podSelector, d)) && r.ports.some((q) => q.port === api),
        ),
        `workers may reach the coordinator pods of ${f} on port ${api}`,
      );
    }
    assert.ok(selects(workerPolicy.spec.podSelector, worker), "parsyn-worker selects the worker pods");
    assert.ok(!selects(coordinatorPolicy.spec.podSelector, worker), "parsyn-coordinator selects no worker pods");
    assert.deepEqual(workerPolicy.spec.ingress ?? [], [], "workers accept no ingress");
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
    assert.equal(s.spec.ports[0].name, "https");
    assert.equal(s.metadata.annotations["prometheus.io/scrape"], "true");
    assert.equal(s.metadata.annotations["prometheus.io/scheme"], "https");
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
