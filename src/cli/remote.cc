#include "cli/remote.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <utility>

#include "base/text_file.h"
#include "cli/commands.h"
#include "cli/config_file.h"

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

// "URL1,URL2" as a list, trimmed, without trailing slashes (as the worker's SplitServerUrls; this library does not
// link the worker's).
std::vector<std::string> SplitUrls(const std::string& urls) {
  std::vector<std::string> out;
  std::stringstream ss(urls);
  for (std::string url; std::getline(ss, url, ',');) {
    while (!url.empty() && std::isspace(static_cast<unsigned char>(url.front()))) url.erase(0, 1);
    while (!url.empty() && (std::isspace(static_cast<unsigned char>(url.back())) || url.back() == '/')) url.pop_back();
    if (!url.empty()) out.push_back(std::move(url));
  }
  return out;
}

// Of several coordinator URLs (failover), the one whose /readyz says it is the leader; else the first that answers
// (its 503s name the leader), else the first.
std::string FindLeader(const std::vector<std::string>& urls, const std::string& ca_file) {
  std::string answered;
  for (const std::string& url : urls) {
    http::Client probe(http::ClientOptions{.base_url = url,
                                           .connect_timeout = std::chrono::seconds(2),
                                           .timeout = std::chrono::seconds(5),
                                           .max_attempts = 1,
                                           .ca_file = ca_file});
    StatusOr<http::ClientResponse> res = probe.Get("/readyz");
    if (!res.ok() && res.status().code() != StatusCode::kUnavailable) continue;
    StatusOr<nlohmann::json> body = res.ok() ? res->Json() : StatusOr<nlohmann::json>(res.status());
    if (body.ok() && body->is_object() && body->value("role", "") == "leader") return url;
    if (res.ok() && answered.empty()) answered = url;
  }
  return answered.empty() ? urls.front() : answered;
}

}  // namespace

void AddRemoteFlags(CLI::App& command, RemoteFlags& flags) {
  command.add_option(
      "--server", flags.server,
      "coordinator URL, or several comma-separated (failover: the leader is used) (default: $PARSYN_SERVER, the "
      "config file's server, else <data-dir>/server.json)");
  command.add_option("--api-key", flags.api_key,
                     "admin API key (default: $PARSYN_API_KEY, else the key file: --key-file, $PARSYN_KEY_FILE, the "
                     "config file's key_file, <data-dir>/admin-key)");
  command.add_option("--key-file", flags.key_file, "a file holding the admin API key");
  command.add_option("--data-dir", flags.data_dir,
                     "the local server's data directory (default: $PARSYN_DATA_DIR, the config file's data_dir, else "
                     "./parsyn-data)");
  command.add_option("--ca-file", flags.ca_file,
                     "PEM CA certificate(s) to trust for an https:// server's certificate, besides the system's "
                     "(default: $PARSYN_CA_FILE, the config file's ca_file, else server.json's)");
  command.add_option("--project", flags.project,
                     "the project to act in (default: $PARSYN_PROJECT, the config file's project, else the server's "
                     "\"default\")");
  command.add_option("--config", flags.config,
                     "the CLI config file (default: $PARSYN_CONFIG, else $XDG_CONFIG_HOME/parsyn/config.toml or "
                     "~/.config/parsyn/config.toml when it exists)");
  command.add_option("--output", flags.output, "text (for people) or json (the API's JSON on stdout, for scripts)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
}

void AddProgressFlag(CLI::App& command, RemoteFlags& flags) {
  command.add_flag("--progress", flags.progress,
                   "show transfer progress bars on stderr even when it is not a terminal (default: only on one)");
}

bool ShowTransferProgress(const RemoteFlags& flags) { return flags.progress || isatty(STDERR_FILENO) != 0; }

std::string DefaultDataDir() {
  std::string dir = Env("PARSYN_DATA_DIR");
  return dir.empty() ? "parsyn-data" : dir;
}

std::filesystem::path LoginKeyPath() {
  if (std::string xdg = Env("XDG_CONFIG_HOME"); !xdg.empty())
    return std::filesystem::path(xdg) / "parsyn" / "login-key";
  return std::filesystem::path(Env("HOME").empty() ? "." : Env("HOME")) / ".config" / "parsyn" / "login-key";
}

StatusOr<RemoteSettings> ResolveRemote(const RemoteFlags& flags, bool need_key) {
  PARSYN_ASSIGN_OR_RETURN(CliConfig config, LoadCliConfig(flags.config));
  // The first non-empty of flag, environment, config file (the order at the top of remote.h).
  auto first = [](std::initializer_list<std::string> candidates) {
    for (const std::string& c : candidates) {
      if (!c.empty()) return c;
    }
    return std::string();
  };
  RemoteSettings settings;
  settings.data_dir = first({flags.data_dir, Env("PARSYN_DATA_DIR"), config.data_dir.string(), "parsyn-data"});
  settings.server = first({flags.server, Env("PARSYN_SERVER"), config.server});
  settings.ca_file = first({flags.ca_file, Env("PARSYN_CA_FILE"), config.ca_file.string()});
  settings.project = first({flags.project, Env("PARSYN_PROJECT"), config.project});
  if (settings.server.empty()) {
    nlohmann::json info = nlohmann::json::parse(ReadFileTrimmed(settings.data_dir + "/server.json"), nullptr, false);
    if (info.is_object() && info.contains("url") && info["url"].is_string()) settings.server = info["url"];
    // A local HTTPS server names its certificate file there.
    if (settings.ca_file.empty() && info.is_object() && info.contains("ca_file") && info["ca_file"].is_string()) {
      settings.ca_file = info["ca_file"];
    }
  }
  if (settings.server.empty()) {
    return InvalidArgumentError(
        "no server: pass --server URL, set PARSYN_SERVER, write server = \"URL\" in " +
        (config.path.empty() ? FindCliConfig(flags.config).path.string() : config.path.string()) +
        ", or run `parsyn server --data-dir " + settings.data_dir + "` on this machine");
  }
  // The key itself or a file holding it, flags before the environment before the config file. A key file named
  // anywhere must be readable: falling back to another key would hide the mistake.
  auto read_key_file = [](const std::string& file, const std::string& named_by) -> StatusOr<std::string> {
    StatusOr<std::string> key = ReadTrimmedTextFile(file);
    if (key.ok() && !key->empty()) return key;
    return NotFoundError("the admin key file " + file + " (" + named_by + ") " +
                         (key.ok() ? "is empty" : "cannot be read"));
  };
  if (!flags.api_key.empty()) {
    settings.api_key = flags.api_key;
  } else if (!flags.key_file.empty()) {
    PARSYN_ASSIGN_OR_RETURN(settings.api_key, read_key_file(flags.key_file, "--key-file"));
  } else if (!Env("PARSYN_API_KEY").empty()) {
    settings.api_key = Env("PARSYN_API_KEY");
  } else if (!Env("PARSYN_KEY_FILE").empty()) {
    PARSYN_ASSIGN_OR_RETURN(settings.api_key, read_key_file(Env("PARSYN_KEY_FILE"), "PARSYN_KEY_FILE"));
  } else if (!config.key_file.empty()) {
    PARSYN_ASSIGN_OR_RETURN(settings.api_key, read_key_file(config.key_file, "key_file in " + config.path.string()));
  } else if (std::string login = ReadFileTrimmed(LoginKeyPath().string()); !login.empty()) {
    settings.api_key = login;
  } else {
    settings.api_key = ReadFileTrimmed(settings.data_dir + "/admin-key");
  }
  if (settings.api_key.empty() && need_key) {
    return InvalidArgumentError(
        "no API key: pass --api-key or --key-file FILE, set PARSYN_API_KEY or PARSYN_KEY_FILE, write key_file = "
        "\"FILE\" in the config file, run `parsyn login` (single sign-on), or use the data directory of a local "
        "server (" +
        settings.data_dir + "/admin-key)");
  }
  return settings;
}

StatusOr<std::unique_ptr<http::Client>> ConnectToServer(const RemoteFlags& flags) {
  PARSYN_ASSIGN_OR_RETURN(RemoteSettings settings, ResolveRemote(flags));
  http::ClientOptions options;
  options.base_url = settings.server;
  if (std::vector<std::string> urls = SplitUrls(settings.server); urls.size() > 1) {
    options.base_url = FindLeader(urls, settings.ca_file);
  }
  options.bearer_token = settings.api_key;
  options.unreachable_hint = "is `parsyn server` running?";
  options.ca_file = settings.ca_file;
  if (!settings.project.empty()) options.headers.emplace_back("X-Parsyn-Project", settings.project);
  return std::make_unique<http::Client>(options);
}

CLI::App* SubcommandGroup(CLI::App& app, const std::string& name, const std::string& description) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == name) return sub;
  }
  return app.add_subcommand(name, description);
}

int Fail(const std::string& command, const Status& status) { return Fail(command, status.message()); }

void PrintJson(const nlohmann::json& value) { std::cout << value.dump(2) << "\n"; }

int PrintResource(const RemoteFlags& flags, const std::string& command, const std::string& path) {
  StatusOr<std::unique_ptr<http::Client>> client = ConnectToServer(flags);
  if (!client.ok()) return Fail(command, client.status());
  StatusOr<http::ClientResponse> res = (*client)->Get(path);
  if (!res.ok()) return Fail(command, res.status());
  StatusOr<nlohmann::json> body = res->Json();
  if (!body.ok()) return Fail(command, body.status());
  PrintJson(*body);
  return 0;
}

nlohmann::json ListAnswer(const std::string& field, nlohmann::json items) {
  return nlohmann::json{{field, std::move(items)}, {"next_cursor", nullptr}};
}

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
