// The CLI's config file: where the coordinator commands (job, dataset, model upload/list, worker register/list) find
// the server, the admin key file, extra CAs and the local data directory when neither a flag nor the environment says.
//
// Where: --config FILE, else $PARSYN_CONFIG, else $XDG_CONFIG_HOME/parsyn/config.toml, else
// ~/.config/parsyn/config.toml. A file named by --config or PARSYN_CONFIG must exist; the default one may be absent.
//
// What: a strict subset of TOML, one `key = value` a line:
//   # comments, on their own line or after a value
//   server = "https://coordinator.example:8443"
//   key_file = "/var/lib/parsyn/admin-key"      # a file holding the admin API key
//   ca_file = "ca.pem"                          # extra CAs to trust (relative paths: to the config file's folder)
//   data_dir = "/var/lib/parsyn"                # the local server's data directory
//   project = "vision"                          # the project the commands act in (default: the server's "default")
//   [trainers]                                  # `parsyn worker`'s trainers (its --trainer NAME=COMMAND), last:
//   tabular = "python3 /opt/trainers/tabular.py"  # NAME = "COMMAND"
// Values are TOML strings ("basic" with \" \\ \n \t \uXXXX escapes, or 'literal'); integers, floats and booleans are
// parsed but every key above takes a string. An unknown key, a key given twice, a section other than [trainers]
// (whose keys are trainer names), a value of the wrong type or anything else malformed is an error "FILE:LINE: ..."
// that names it.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace parsyn::cli {

struct CliConfig {
  std::filesystem::path path;  // the file read; empty when there is none
  std::string server;
  std::filesystem::path key_file;  // absolute (relative values are taken from the file's folder)
  std::filesystem::path ca_file;
  std::filesystem::path data_dir;
  std::string project;
  // [trainers]: (name, command line) in the file's order.
  std::vector<std::pair<std::string, std::string>> trainers;
};

// Parses `text` as the config file `path` (used in messages and to resolve relative paths).
StatusOr<CliConfig> ParseCliConfig(std::string_view text, const std::filesystem::path& path);

// The config file's path by the rules above (`flag`: --config's value, may be empty), and whether it must exist.
struct ConfigLocation {
  std::filesystem::path path;  // empty when no rule names one (no HOME either)
  bool required = false;
};
ConfigLocation FindCliConfig(const std::string& flag);

// Reads the config file FindCliConfig(flag) names: an empty CliConfig when the default file is absent; NotFound when
// a file named by --config or PARSYN_CONFIG is; ParseCliConfig's errors.
StatusOr<CliConfig> LoadCliConfig(const std::string& flag);

}  // namespace parsyn::cli
