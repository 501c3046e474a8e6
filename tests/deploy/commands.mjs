// Prints, as one JSON object on stdout, every container command line of deploy/kubernetes/*.yaml and the Dockerfile,
// for tests/e2e/deploy_test.cc to start against the built binaries. Exits 77 when the npm packages are missing.
// Usage: node commands.mjs REPO_ROOT
// {"containers": [{"file", "workload", "container", "argv": [...], "env": [{"name", "value"} | {"name", "secret":
//   {"name", "key"}} | {"name", "field"}], "mounts": [{"path", "secret"?: NAME}]}],
//  "secrets": {NAME: [KEY...]}, "dockerfile": {"argv": [...], "env": {...}}}
import { loadDockerfile, loadManifests } from "./manifests.mjs";

const root = process.argv[2];
const out = { containers: [], secrets: {}, dockerfile: null };
for (const { file, doc } of await loadManifests(root)) {
  if (doc.kind === "Secret") out.secrets[doc.metadata.name] = Object.keys(doc.stringData ?? doc.data ?? {});
  const pod = doc.spec?.template?.spec;
  if (!pod) continue;
  const volumes = Object.fromEntries((pod.volumes ?? []).map((v) => [v.name, v]));
  for (const c of pod.containers) {
    out.containers.push({
      file,
      workload: `${doc.kind}/${doc.metadata.name}`,
      container: c.name,
      // Kubernetes runs command + args (command replaces the image's ENTRYPOINT, args its CMD).
      argv: [...(c.command ?? []), ...(c.args ?? [])],
      env: (c.env ?? []).map((e) => {
        if (e.value !== undefined) return { name: e.name, value: String(e.value) };
        if (e.valueFrom?.secretKeyRef) return { name: e.name, secret: e.valueFrom.secretKeyRef };
        if (e.valueFrom?.fieldRef) return { name: e.name, field: e.valueFrom.fieldRef.fieldPath };
        throw new Error(`${file}: env ${e.name} has a source this test does not know`);
      }),
      mounts: (c.volumeMounts ?? []).map((m) => {
        const v = volumes[m.name];
        if (!v) throw new Error(`${file}: volumeMount ${m.name} names no volume`);
        return v.secret ? { path: m.mountPath, secret: v.secret.secretName } : { path: m.mountPath };
      }),
    });
  }
}
const docker = loadDockerfile(root);
out.dockerfile = { argv: [...docker.entrypoint, ...docker.cmd], env: docker.env };
console.log(JSON.stringify(out, null, 1));
