// parsyn worker register --name N [--kind own|managed] | list
#include <iomanip>
#include <iostream>

#include "cli/coordinator_commands.h"
#include "cli/remote.h"

namespace parsyn::cli {
namespace {

using nlohmann::json;

struct WorkerFlags {
  RemoteFlags remote;
  std::string name;
  std::string kind = "own";
};

int Register(const WorkerFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("worker register", client.status());
  auto res = (*client)->PostJson("/api/v1/workers", json{{"name", f.name}, {"kind", f.kind}});
  if (!res.ok()) return Fail("worker register", res.status());
  auto w = res->Json();
  if (!w.ok()) return Fail("worker register", w.status());
  std::cout << "worker " << (*w)["id"] << " '" << (*w)["name"].get<std::string>() << "' registered\n"
            << "token (shown once; pass it to `parsyn worker`): " << (*w)["token"].get<std::string>() << "\n";
  return 0;
}

int List(const WorkerFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("worker list", client.status());
  StatusOr<json> workers = ListAll(**client, "/api/v1/workers", "workers");
  if (!workers.ok()) return Fail("worker list", workers.status());
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
  reg->callback([flags, &exit_code] { exit_code = Register(*flags); });
  CLI::App* list = group->add_subcommand("list", "list workers");
  AddRemoteFlags(*list, flags->remote);
  list->callback([flags, &exit_code] { exit_code = List(*flags); });
}

}  // namespace parsyn::cli
