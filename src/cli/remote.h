// How the CLI's coordinator commands (job, dataset, model upload/list, worker register) find the server and the
// admin key: flags first, then PARSYN_SERVER / PARSYN_API_KEY, then the local data directory that `parsyn server`
// writes (<data_dir>/server.json holds its URL, and for an HTTPS server its certificate file as "ca_file";
// <data_dir>/admin-key the key). The data directory is --data-dir, else PARSYN_DATA_DIR, else ./parsyn-data. Extra
// CAs to trust: --ca-file, else PARSYN_CA_FILE, else server.json's ca_file.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "http/client.h"

namespace parsyn::cli {

struct RemoteFlags {
  std::string server;
  std::string api_key;
  std::string data_dir;
  std::string ca_file;  // extra trusted CAs for an https:// server with a private CA
};

// Adds --server, --api-key, --data-dir and --ca-file (default: $PARSYN_CA_FILE) to a command.
void AddRemoteFlags(CLI::App& command, RemoteFlags& flags);
// The default data directory: PARSYN_DATA_DIR, else "parsyn-data".
std::string DefaultDataDir();
// A client for the resolved server and key. InvalidArgument naming where it looked when either is missing.
StatusOr<std::unique_ptr<http::Client>> ConnectToServer(const RemoteFlags& flags);
// The subcommand `name` of `app`, created with `description` when absent (groups shared between files).
CLI::App* SubcommandGroup(CLI::App& app, const std::string& name, const std::string& description);
// Prints "parsyn <command>: <message>" to stderr and returns 1.
int Fail(const std::string& command, const Status& status);
// Prints JSON, indented, to stdout.
void PrintJson(const nlohmann::json& value);
// Every item of a list route (`path`, which answers {"<field>": [...], "next_cursor"}), following next_cursor page by
// page of `page_size` (docs/openapi.yaml, "Pagination"): the JSON array of all of them. Errors: the client's, or a
// page that is not such an answer.
StatusOr<nlohmann::json> ListAll(http::Client& client, const std::string& path, const std::string& field,
                                 int page_size = 1000);

}  // namespace parsyn::cli
