// parsyn model upload DIR [--name N] | list | get ID: a model folder (config.json, weights, tokenizer) goes up one file
// per request to /api/v1/uploads, then one POST /api/v1/models names the files.
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "cli/coordinator_commands.h"
#include "cli/progress_bar.h"
#include "cli/remote.h"

namespace parsyn::cli {
namespace {

using nlohmann::json;

struct ModelFlags {
  RemoteFlags remote;
  std::string dir;
  std::string name;
  int64_t id = 0;
};

int UploadModel(const ModelFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("model upload", client.status());
  const std::filesystem::path root(f.dir);
  json files = json::object();
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const std::string rel = std::filesystem::relative(it->path(), root).generic_string();
    if (rel.empty() || rel[0] == '.') continue;  // hidden files (.git, caches) are not part of the model
    http::CallOptions call;
    call.timeout = std::chrono::milliseconds(0);
    std::error_code size_ec;
    TransferProgress progress(std::cerr, ShowTransferProgress(f.remote), rel, it->file_size(size_ec));
    call.on_transfer = [&progress](uint64_t bytes) { progress.Update(bytes); };
    auto res =
        (*client)->UploadFile(http::Method::kPost, "/api/v1/uploads", it->path(), "application/octet-stream", call);
    progress.Finish();
    if (!res.ok()) return Fail("model upload", res.status().WithContext(rel));
    auto body = res->Json();
    if (!body.ok()) return Fail("model upload", body.status());
    files[rel] = (*body)["upload_id"];
    if (!JsonOutput(f.remote)) std::cout << "uploaded " << rel << " (" << (*body)["size_bytes"] << " bytes)\n";
  }
  if (ec) return Fail("model upload", UnavailableError("cannot read " + f.dir + ": " + ec.message()));
  const std::string name =
      f.name.empty() ? std::filesystem::absolute(root).lexically_normal().filename().string() : f.name;
  auto res = (*client)->PostJson("/api/v1/models", json{{"name", name}, {"files", files}});
  if (!res.ok()) return Fail("model upload", res.status());
  auto model = res->Json();
  if (!model.ok()) return Fail("model upload", model.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*model);
    return 0;
  }
  std::cout << "model " << (*model)["id"] << " '" << (*model)["name"].get<std::string>() << "' ("
            << (*model)["model_type"].get<std::string>() << ")\n";
  return 0;
}

int ListModels(const ModelFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("model list", client.status());
  StatusOr<json> models = ListAll(**client, "/api/v1/models", "models");
  if (!models.ok()) return Fail("model list", models.status());
  if (JsonOutput(f.remote)) {
    PrintJson(ListAnswer("models", *std::move(models)));
    return 0;
  }
  std::cout << std::left << std::setw(6) << "ID" << std::setw(28) << "NAME" << std::setw(12) << "TYPE"
            << "BYTES\n";
  for (const json& m : *models) {
    std::cout << std::left << std::setw(6) << m["id"].get<int64_t>() << std::setw(28) << m["name"].get<std::string>()
              << std::setw(12) << m["model_type"].get<std::string>() << m["size_bytes"].get<int64_t>() << "\n";
  }
  return 0;
}

}  // namespace

void AddModelRemoteCommands(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<ModelFlags>();
  CLI::App* group = SubcommandGroup(app, "model", "models");
  CLI::App* upload = group->add_subcommand("upload", "upload a model folder to a coordinator");
  AddRemoteFlags(*upload, flags->remote);
  AddProgressFlag(*upload, flags->remote);
  upload->add_option("dir", flags->dir, "the model folder")->required()->check(CLI::ExistingDirectory);
  upload->add_option("--name", flags->name, "model name (default: the folder name)");
  upload->callback([flags, &exit_code] { exit_code = UploadModel(*flags); });
  CLI::App* list = group->add_subcommand("list", "list the coordinator's models");
  AddRemoteFlags(*list, flags->remote);
  list->callback([flags, &exit_code] { exit_code = ListModels(*flags); });
  CLI::App* get = group->add_subcommand("get", "show a coordinator's model (its JSON)");
  AddRemoteFlags(*get, flags->remote);
  get->add_option("id", flags->id, "model id")->required();
  get->callback([flags, &exit_code] {
    exit_code = PrintResource(flags->remote, "model get", "/api/v1/models/" + std::to_string(flags->id));
  });
}

}  // namespace parsyn::cli
