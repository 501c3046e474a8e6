// How the CLI's coordinator commands (job, dataset, model upload/list, worker register/list) find the server, the
// admin key and extra CAs: one resolver, ResolveRemote. Each setting is taken from the first of
//   1. its flag:               --server, --api-key or --key-file, --ca-file, --data-dir, --project
//   2. the environment:        PARSYN_SERVER, PARSYN_API_KEY or PARSYN_KEY_FILE, PARSYN_CA_FILE, PARSYN_DATA_DIR,
//                              PARSYN_PROJECT
//   3. the config file:        server, key_file, ca_file, data_dir, project (config_file.h: --config, PARSYN_CONFIG,
//                              $XDG_CONFIG_HOME/parsyn/config.toml, ~/.config/parsyn/config.toml)
//   4. for the key only: the one `parsyn login` saved (LoginKeyPath())
//   5. the local data directory that `parsyn server` writes (./parsyn-data unless 1-3 name one): <data_dir>/server.json
//      holds its URL (and for an HTTPS server its certificate file as "ca_file"), <data_dir>/admin-key the key.
//      (4 and 5 only when 1-3 name none)
// The server may be several comma-separated URLs (coordinators in failover): the one whose /readyz says "leader" is
// used, else the first that answers.
// Also --output text|json (what the command prints on stdout) and --progress (transfer bars on a non-terminal).
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
  std::string key_file;  // a file holding the admin key
  std::string data_dir;
  std::string ca_file;          // extra trusted CAs for an https:// server with a private CA
  std::string project;          // the project the commands act in (X-Parsyn-Project; none: the server's "default")
  std::string config;           // --config: the CLI config file (config_file.h)
  std::string output = "text";  // --output: text (for people) or json (the API's JSON, for scripts)
  bool progress = false;        // --progress: transfer bars even when stderr is not a terminal
};

// Adds --server, --api-key, --key-file, --data-dir, --ca-file, --project, --config and --output to a command.
void AddRemoteFlags(CLI::App& command, RemoteFlags& flags);
// Adds --progress (upload and download commands).
void AddProgressFlag(CLI::App& command, RemoteFlags& flags);
// Whether transfer bars show: --progress, or stderr is a terminal.
bool ShowTransferProgress(const RemoteFlags& flags);
// The default data directory: PARSYN_DATA_DIR, else "parsyn-data".
std::string DefaultDataDir();

// Where to reach the coordinator, resolved by the rules at the top of this file.
struct RemoteSettings {
  std::string server;
  std::string api_key;
  std::string ca_file;
  std::string data_dir;
  std::string project;  // empty: the server's default project
};
// InvalidArgument naming every place it looked when the server or key is missing; a config file's errors
// (FILE:LINE: ...); NotFound for a key file named by a flag, the environment or the config file that cannot be read.
// `need_key` false: a missing key is no error (`parsyn login`, which comes to get one).
StatusOr<RemoteSettings> ResolveRemote(const RemoteFlags& flags, bool need_key = true);
// Where `parsyn login` saves the key it gets: $XDG_CONFIG_HOME/parsyn/login-key, else ~/.config/parsyn/login-key.
std::filesystem::path LoginKeyPath();
// A client for ResolveRemote's server and key, naming its project (X-Parsyn-Project) on every call.
StatusOr<std::unique_ptr<http::Client>> ConnectToServer(const RemoteFlags& flags);
// --output json was asked for.
inline bool JsonOutput(const RemoteFlags& flags) { return flags.output == "json"; }
// The subcommand `name` of `app`, created with `description` when absent (groups shared between files).
CLI::App* SubcommandGroup(CLI::App& app, const std::string& name, const std::string& description);
// Prints "parsyn <command>: <message>" to stderr and returns 1.
int Fail(const std::string& command, const Status& status);
// Prints JSON, indented, to stdout.
void PrintJson(const nlohmann::json& value);
// `<group> get ID`: GET `path` and print the API's JSON (both --output forms: it is the command's data). 0 or 1.
int PrintResource(const RemoteFlags& flags, const std::string& command, const std::string& path);
// What `list --output json` prints: the list route's answer with every item on one page,
// {"<field>": [...], "next_cursor": null}.
nlohmann::json ListAnswer(const std::string& field, nlohmann::json items);
// Every item of a list route (`path`, which answers {"<field>": [...], "next_cursor"}), following next_cursor page by
// page of `page_size` (docs/openapi.yaml, "Pagination"): the JSON array of all of them. Errors: the client's, or a
// page that is not such an answer.
StatusOr<nlohmann::json> ListAll(http::Client& client, const std::string& path, const std::string& field,
                                 int page_size = 1000);

}  // namespace parsyn::cli
