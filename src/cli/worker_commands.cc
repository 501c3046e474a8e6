// parsyn worker register --name N [--kind own|managed] [--ca-cert CA.pem --ca-key CA.key [--cert-out DIR]]
//              | list | get ID
// With --ca-cert/--ca-key, register also issues the worker's client certificate for a coordinator with mutual TLS
// (`parsyn server --client-ca CA.pem`): a new key and a certificate for "worker-<id>" signed by that CA, valid for a
// year (coordinator/auth.h IssueWorkerCertificate), written as DIR/worker-<id>.pem and DIR/worker-<id>.key (0600).
#include <iomanip>
#include <iostream>

#include "base/atomic_file.h"
#include "cli/coordinator_commands.h"
#include "cli/remote.h"
#include "coordinator/auth.h"

namespace parsyn::cli {
namespace {

using nlohmann::json;

struct WorkerFlags {
  RemoteFlags remote;
  std::string name;
  std::string kind = "own";
  std::string ca_cert;
  std::string ca_key;
  std::string cert_out = ".";
  int64_t id = 0;
};

struct CertificateFiles {
  std::filesystem::path cert, key;
};

// Issues and writes worker `id`'s client certificate (see the top of the file).
StatusOr<CertificateFiles> WriteWorkerCertificate(const WorkerFlags& f, int64_t id) {
  StatusOr<coordinator::IssuedCertificate> issued = coordinator::IssueWorkerCertificate(f.ca_cert, f.ca_key, id);
  if (!issued.ok()) {
    return issued.status().WithContext("worker " + std::to_string(id) + " is registered, but its certificate");
  }
  const std::filesystem::path dir(f.cert_out);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  CertificateFiles files{dir / (issued->identity + ".pem"), dir / (issued->identity + ".key")};
  PARSYN_RETURN_IF_ERROR(WriteFileAtomically(files.key, issued->private_key_pem, 0600));
  PARSYN_RETURN_IF_ERROR(WriteFileAtomically(files.cert, issued->certificate_pem, 0644));
  return files;
}

int Register(const WorkerFlags& f) {
  if (f.ca_cert.empty() != f.ca_key.empty()) {
    std::cerr << "parsyn worker register: --ca-cert and --ca-key go together (the CA that signs the certificate)\n";
    return 2;
  }
  if (!f.ca_cert.empty()) {
    // The CA is checked (a throw-away certificate) before the worker exists, so a wrong file registers nothing.
    StatusOr<coordinator::IssuedCertificate> probe = coordinator::IssueWorkerCertificate(f.ca_cert, f.ca_key, 0);
    if (!probe.ok()) return Fail("worker register", probe.status());
  }
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("worker register", client.status());
  auto res = (*client)->PostJson("/api/v1/workers", json{{"name", f.name}, {"kind", f.kind}});
  if (!res.ok()) return Fail("worker register", res.status());
  auto w = res->Json();
  if (!w.ok()) return Fail("worker register", w.status());
  if (JsonOutput(f.remote)) {
    // The API's worker (its token included), and where the client certificate went when one was issued.
    json out = *w;
    if (!f.ca_cert.empty()) {
      StatusOr<CertificateFiles> files = WriteWorkerCertificate(f, (*w)["id"].get<int64_t>());
      if (!files.ok()) return Fail("worker register", files.status());
      out["certificate_file"] = files->cert.string();
      out["certificate_key_file"] = files->key.string();
    }
    PrintJson(out);
    return 0;
  }
  std::cout << "worker " << (*w)["id"] << " '" << (*w)["name"].get<std::string>() << "' registered\n"
            << "token (shown once; pass it to `parsyn worker`): " << (*w)["token"].get<std::string>() << "\n";
  if (!f.ca_cert.empty()) {
    StatusOr<CertificateFiles> files = WriteWorkerCertificate(f, (*w)["id"].get<int64_t>());
    if (!files.ok()) return Fail("worker register", files.status());
    const std::string identity = files->cert.stem().string();
    std::cout << "client certificate for " << identity << " (valid one year): " << files->cert.string() << "\n"
              << "its private key (keep it on the worker, 0600): " << files->key.string() << "\n"
              << "run: parsyn worker --server https://... --token ... --cert " << files->cert.string() << " --key "
              << files->key.string() << " [--ca-file the coordinator's CA]\n";
  }
  return 0;
}

int ListWorkers(const WorkerFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("worker list", client.status());
  StatusOr<json> workers = ListAll(**client, "/api/v1/workers", "workers");
  if (!workers.ok()) return Fail("worker list", workers.status());
  if (JsonOutput(f.remote)) {
    PrintJson(ListAnswer("workers", *std::move(workers)));
    return 0;
  }
  std::cout << std::left << std::setw(6) << "ID" << std::setw(20) << "NAME" << std::setw(9) << "KIND" << std::setw(9)
            << "STATUS" << std::setw(6) << "JOB"
            << "DEVICE\n";
  for (const json& w : *workers) {
    std::cout << std::left << std::setw(6) << w["id"].get<int64_t>() << std::setw(20) << w["name"].get<std::string>()
              << std::setw(9) << w["kind"].get<std::string>() << std::setw(9) << w["status"].get<std::string>()
              << std::setw(6) << (w["current_job_id"].is_null() ? std::string("-") : w["current_job_id"].dump())
              << w["device"].get<std::string>() << "\n";
  }
  return 0;
}

}  // namespace

void AddWorkerRegisterCommands(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<WorkerFlags>();
  CLI::App* group = SubcommandGroup(app, "worker", "workers");
  CLI::App* reg = group->add_subcommand("register", "register one of your machines; prints its token once");
  AddRemoteFlags(*reg, flags->remote);
  reg->add_option("--name", flags->name, "worker name")->required();
  reg->add_option("--kind", flags->kind, "own (your machine) or managed (a platform worker)")->capture_default_str();
  reg->add_option("--ca-cert", flags->ca_cert,
                  "PEM CA certificate (the server's --client-ca): also issue the worker's client certificate");
  reg->add_option("--ca-key", flags->ca_key, "PEM private key of --ca-cert (unencrypted)");
  reg->add_option("--cert-out", flags->cert_out, "where to write worker-<id>.pem and worker-<id>.key")
      ->capture_default_str();
  reg->callback([flags, &exit_code] { exit_code = Register(*flags); });
  CLI::App* list = group->add_subcommand("list", "list workers");
  AddRemoteFlags(*list, flags->remote);
  list->callback([flags, &exit_code] { exit_code = ListWorkers(*flags); });
  CLI::App* get = group->add_subcommand("get", "show a worker (its JSON)");
  AddRemoteFlags(*get, flags->remote);
  get->add_option("id", flags->id, "worker id")->required();
  get->callback([flags, &exit_code] {
    exit_code = PrintResource(flags->remote, "worker get", "/api/v1/workers/" + std::to_string(flags->id));
  });
}

}  // namespace parsyn::cli
