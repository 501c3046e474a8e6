#include "cli/remote.h"

#include <cctype>
#include <cstdlib>
#include <iostream>
#include <utility>

#include "base/text_file.h"

namespace parsyn::cli {

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The file's trimmed contents, or "" when it cannot be read (the flag or variable that names it is then missing).
std::string ReadFileTrimmed(const std::string& path) {
  StatusOr<std::string> text = ReadTrimmedTextFile(path);
  return text.ok() ? *std::move(text) : "";
}

}  // namespace

void AddRemoteFlags(CLI::App& command, RemoteFlags& flags) {
  command.add_option("--server", flags.server,
                     "coordinator URL (default: $PARSYN_SERVER, else <data-dir>/server.json)");
  command.add_option("--api-key", flags.api_key, "admin API key (default: $PARSYN_API_KEY, else <data-dir>/admin-key)");
  command.add_option("--data-dir", flags.data_dir,
                     "the local server's data directory (default: $PARSYN_DATA_DIR "
                     "or ./parsyn-data)");
  command.add_option("--ca-file", flags.ca_file,
                     "PEM CA certificate(s) to trust for an https:// server's certificate, besides the system's "
                     "(default: $PARSYN_CA_FILE)");
}

std::string DefaultDataDir() {
  std::string dir = Env("PARSYN_DATA_DIR");
  return dir.empty() ? "parsyn-data" : dir;
}

StatusOr<std::unique_ptr<http::Client>> ConnectToServer(const RemoteFlags& flags) {
  const std::string data_dir = flags.data_dir.empty() ? DefaultDataDir() : flags.data_dir;
  std::string server = !flags.server.empty() ? flags.server : Env("PARSYN_SERVER");
  std::string ca_file = !flags.ca_file.empty() ? flags.ca_file : Env("PARSYN_CA_FILE");
  if (server.empty()) {
    nlohmann::json info = nlohmann::json::parse(ReadFileTrimmed(data_dir + "/server.json"), nullptr, false);
    if (info.is_object() && info.contains("url") && info["url"].is_string()) server = info["url"];
    // A local HTTPS server names its certificate file there.
    if (ca_file.empty() && info.is_object() && info.contains("ca_file") && info["ca_file"].is_string()) {
      ca_file = info["ca_file"];
    }
  }
  if (server.empty()) {
    return InvalidArgumentError("no server: pass --server URL, set PARSYN_SERVER, or run `parsyn server --data-dir " +
                                data_dir + "` on this machine");
  }
  std::string key = !flags.api_key.empty() ? flags.api_key : Env("PARSYN_API_KEY");
  if (key.empty()) key = ReadFileTrimmed(data_dir + "/admin-key");
  if (key.empty()) {
    return InvalidArgumentError(
        "no API key: pass --api-key, set PARSYN_API_KEY, or use the data directory of a "
        "local server (" +
        data_dir + "/admin-key)");
  }
  http::ClientOptions options;
  options.base_url = server;
  options.bearer_token = key;
  options.unreachable_hint = "is `parsyn server` running?";
  options.ca_file = ca_file;
  return std::make_unique<http::Client>(options);
}

CLI::App* SubcommandGroup(CLI::App& app, const std::string& name, const std::string& description) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == name) return sub;
  }
  return app.add_subcommand(name, description);
}

int Fail(const std::string& command, const Status& status) {
  std::cerr << "parsyn " << command << ": " << status.message() << "\n";
  return 1;
}

void PrintJson(const nlohmann::json& value) { std::cout << value.dump(2) << "\n"; }

StatusOr<nlohmann::json> ListAll(http::Client& client, const std::string& path, const std::string& field,
                                 int page_size) {
  nlohmann::json items = nlohmann::json::array();
  std::string cursor;
  const char separator = path.find('?') == std::string::npos ? '?' : '&';
  while (true) {
    std::string page_path = path + separator + "limit=" + std::to_string(page_size);
    if (!cursor.empty()) {
      page_path += "&cursor=";
      for (unsigned char c : cursor) {  // opaque: sent back as it came, escaped for the query
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
          page_path += static_cast<char>(c);
        } else {
          page_path += '%';
          page_path += "0123456789ABCDEF"[c >> 4];
          page_path += "0123456789ABCDEF"[c & 15];
        }
      }
    }
    PARSYN_ASSIGN_OR_RETURN(http::ClientResponse res, client.Get(page_path));
    PARSYN_ASSIGN_OR_RETURN(nlohmann::json page, res.Json());
    if (!page.is_object() || !page.contains(field) || !page[field].is_array()) {
      return InvalidArgumentError("GET " + path + " answered no \"" + field + "\" list");
    }
    for (nlohmann::json& item : page[field]) items.push_back(std::move(item));
    const nlohmann::json& next = page.value("next_cursor", nlohmann::json());
    if (!next.is_string()) return items;  // null (or absent: a server from before pagination) ends the list
    cursor = next.get<std::string>();
  }
}

}  // namespace parsyn::cli
