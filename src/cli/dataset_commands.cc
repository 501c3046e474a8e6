// parsyn dataset upload FILE [--name N] [--format jsonl|csv] [--label-column C] | list | get ID
#include <cctype>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "cli/coordinator_commands.h"
#include "cli/progress_bar.h"
#include "cli/remote.h"

namespace parsyn::cli {
namespace {

using nlohmann::json;

struct DatasetFlags {
  RemoteFlags remote;
  std::string file;
  std::string name;
  std::string format;
  std::string label_column;
  int64_t id = 0;
};

std::string QueryEscape(const std::string& s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

int UploadDataset(const DatasetFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("dataset upload", client.status());
  const std::string name = f.name.empty() ? std::filesystem::path(f.file).filename().string() : f.name;
  std::string path = "/api/v1/datasets?name=" + QueryEscape(name);
  // The format comes from --format, else from the file's own extension (the chosen name may have none, e.g.
  // `--name d`), else the server reads it from the name.
  std::string format = f.format;
  if (format.empty()) {
    const std::string ext = std::filesystem::path(f.file).extension().string();
    if (ext == ".jsonl" || ext == ".csv") format = ext.substr(1);
  }
  if (!format.empty()) path += "&format=" + QueryEscape(format);
  if (!f.label_column.empty()) path += "&label_column=" + QueryEscape(f.label_column);
  http::CallOptions call;
  call.timeout = std::chrono::milliseconds(0);  // large files: only the stall timeout applies
  std::error_code ec;
  TransferProgress progress(std::cerr, ShowTransferProgress(f.remote), name, std::filesystem::file_size(f.file, ec));
  call.on_transfer = [&progress](uint64_t bytes) { progress.Update(bytes); };
  auto res = (*client)->UploadFile(http::Method::kPost, path, f.file, "application/octet-stream", call);
  progress.Finish();
  if (!res.ok()) return Fail("dataset upload", res.status());
  auto d = res->Json();
  if (!d.ok()) return Fail("dataset upload", d.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*d);
    return 0;
  }
  std::cout << "dataset " << (*d)["id"] << " '" << (*d)["name"].get<std::string>() << "': " << (*d)["row_count"]
            << " rows (" << (*d)["kind"].get<std::string>() << ")\n";
  return 0;
}

int ListDatasets(const DatasetFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("dataset list", client.status());
  StatusOr<json> datasets = ListAll(**client, "/api/v1/datasets", "datasets");
  if (!datasets.ok()) return Fail("dataset list", datasets.status());
  if (JsonOutput(f.remote)) {
    PrintJson(ListAnswer("datasets", *std::move(datasets)));
    return 0;
  }
  std::cout << std::left << std::setw(6) << "ID" << std::setw(28) << "NAME" << std::setw(8) << "FORMAT" << std::setw(20)
            << "KIND"
            << "ROWS\n";
  for (const json& d : *datasets) {
    std::cout << std::left << std::setw(6) << d["id"].get<int64_t>() << std::setw(28) << d["name"].get<std::string>()
              << std::setw(8) << d["format"].get<std::string>() << std::setw(20) << d["kind"].get<std::string>()
              << d["row_count"].get<int64_t>() << "\n";
  }
  return 0;
}

}  // namespace

void AddDatasetCommands(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<DatasetFlags>();
  CLI::App* group = SubcommandGroup(app, "dataset", "datasets on a coordinator");
  group->require_subcommand(1);
  CLI::App* upload = group->add_subcommand("upload", "upload and validate a JSONL or CSV dataset");
  AddRemoteFlags(*upload, flags->remote);
  AddProgressFlag(*upload, flags->remote);
  upload->add_option("file", flags->file, "the dataset file")->required()->check(CLI::ExistingFile);
  upload->add_option("--name", flags->name, "dataset name (default: the file name)");
  upload->add_option("--format", flags->format, "jsonl or csv (default: from the file extension)");
  upload->add_option("--label-column", flags->label_column, "CSV label column (default: label)");
  upload->callback([flags, &exit_code] { exit_code = UploadDataset(*flags); });
  CLI::App* list = group->add_subcommand("list", "list datasets");
  AddRemoteFlags(*list, flags->remote);
  list->callback([flags, &exit_code] { exit_code = ListDatasets(*flags); });
  CLI::App* get = group->add_subcommand("get", "show a dataset (its JSON)");
  AddRemoteFlags(*get, flags->remote);
  get->add_option("id", flags->id, "dataset id")->required();
  get->callback([flags, &exit_code] {
    exit_code = PrintResource(flags->remote, "dataset get", "/api/v1/datasets/" + std::to_string(flags->id));
  });
}

}  // namespace parsyn::cli
