// The CLI config file's parser (config_file.h): what it accepts, and the FILE:LINE errors for what it does not.
#include "cli/config_file.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace parsyn::cli {
namespace {

namespace fs = std::filesystem;

TEST(CliConfigTest, ReadsTheKeysWithCommentsAndBothStringForms) {
  StatusOr<CliConfig> config = ParseCliConfig(R"(# the coordinator
server = "https://coordinator.example:8443"   # after a value too

key_file = '/etc/parsyn/admin key'
  ca_file = "certs/ca.pem"
data_dir="/var/lib/parsyn\u00e9"
project = "vision"                            # not a path: kept as it is
)",
                                              "/home/u/.config/parsyn/config.toml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->server, "https://coordinator.example:8443");
  EXPECT_EQ(config->key_file, "/etc/parsyn/admin key");
  EXPECT_EQ(config->ca_file, "/home/u/.config/parsyn/certs/ca.pem");  // relative: from the file's folder
  EXPECT_EQ(config->data_dir, "/var/lib/parsyn\xc3\xa9");
  EXPECT_EQ(config->project, "vision");
  EXPECT_TRUE(ParseCliConfig("", "c.toml").ok());
}

TEST(CliConfigTest, TrainersSectionListsNamedCommands) {
  StatusOr<CliConfig> config = ParseCliConfig(
      "server = \"http://a\"\n[trainers]  # the worker's\ntabular = \"python3 train.py --fast\"\nbuiltin = 'hf.py'\n",
      "/etc/c.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->server, "http://a");
  const std::vector<std::pair<std::string, std::string>> want = {{"tabular", "python3 train.py --fast"},
                                                                 {"builtin", "hf.py"}};
  EXPECT_EQ(config->trainers, want);
}

TEST(CliConfigTest, ErrorsNameTheFileLineAndWhat) {
  const std::pair<const char*, const char*> cases[] = {
      {"server = \"a\"\nsevrer = \"b\"\n",
       "c.toml:2: unknown key 'sevrer' (known: server, key_file, ca_file, data_dir, project, and [trainers])"},
      {"server = https://x\n", "c.toml:1: server: 'https://x' is not a value: write a \"quoted string\""},
      {"\n\nserver = \"a\"\nserver = \"b\"\n", "c.toml:4: 'server' is set twice (first on line 3)"},
      {"[remote]\nserver = \"a\"\n", "c.toml:1: the only section is [trainers]"},
      {"[trainers]\ntab = \"a\"\ntab = \"b\"\n", "c.toml:3: 'tab' is set twice (first on line 2)"},
      {"server = 8443\n", "c.toml:1: server must be a string (in quotes), got an integer (8443)"},
      {"key_file = true\n", "c.toml:1: key_file must be a string (in quotes), got a boolean (true)"},
      {"server = \"a\" extra\n", "c.toml:1: unexpected 'extra' after the value of 'server'"},
      {"server = \"open\n", "c.toml:1: server: the string has no closing \""},
      {"server\n", "c.toml:1: expected `key = value`, got 'server'"},
      {"server =\n", "c.toml:1: server: a key needs a value after '='"},
      {"server = \"\"\n", "c.toml:1: server must not be empty"},
      {"server = \"a\\qb\"\n", "c.toml:1: server: unknown escape \\q in a string"},
  };
  for (const auto& [text, expected] : cases) {
    StatusOr<CliConfig> config = ParseCliConfig(text, "c.toml");
    ASSERT_FALSE(config.ok()) << text;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(std::string(config.status().message()).find(expected), 0u)
        << text << "\n  got: " << config.status().message();
  }
}

TEST(CliConfigTest, FoundByFlagThenEnvironmentThenXdgThenHome) {
  const fs::path dir = fs::path(::testing::TempDir()) / "cli_config_find";
  fs::remove_all(dir);
  fs::create_directories(dir / "xdg" / "parsyn");
  std::ofstream(dir / "xdg" / "parsyn" / "config.toml") << "server = \"http://from-xdg\"\n";
  ::setenv("XDG_CONFIG_HOME", (dir / "xdg").c_str(), 1);
  ::setenv("HOME", dir.c_str(), 1);
  ::unsetenv("PARSYN_CONFIG");
  EXPECT_EQ(FindCliConfig("").path, dir / "xdg" / "parsyn" / "config.toml");
  EXPECT_FALSE(FindCliConfig("").required);
  StatusOr<CliConfig> xdg = LoadCliConfig("");
  ASSERT_TRUE(xdg.ok()) << xdg.status().message();
  EXPECT_EQ(xdg->server, "http://from-xdg");

  ::unsetenv("XDG_CONFIG_HOME");
  EXPECT_EQ(FindCliConfig("").path, dir / ".config" / "parsyn" / "config.toml");
  StatusOr<CliConfig> none = LoadCliConfig("");  // the default file may be absent
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_TRUE(none->path.empty());

  ::setenv("PARSYN_CONFIG", (dir / "missing.toml").c_str(), 1);
  EXPECT_EQ(LoadCliConfig("").status().code(), StatusCode::kNotFound);  // a named one must exist
  EXPECT_EQ(FindCliConfig("flag.toml").path, "flag.toml");
  EXPECT_TRUE(FindCliConfig("flag.toml").required);
  ::unsetenv("PARSYN_CONFIG");
}

}  // namespace
}  // namespace parsyn::cli
