// `parsyn demo` as the README's first recipe runs it (`./dev demo` calls it): a server, one managed and two own
// workers, a federated LoRA job on a tiny Llama (bf16 where the CPU computes it, fp32 elsewhere), the adapter
// downloaded and evaluated. Checked: it exits 0, says which precision it chose and why, six rounds are committed,
// exact-match accuracy after training is above that before, and the admin key appears in no output or log the demo
// leaves (the server's stdout is a file, so it writes the key only to DATA/admin-key).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "e2e_harness.h"

namespace parsyn::e2e {
namespace {

TEST(DemoTest, TheDemoTrainsAndLeavesNoSecretInItsLogs) {
  TempDir tmp;
  const fs::path data_dir = tmp.path() / "data";
  CommandResult demo =
      RunParsyn({"demo", "--data-dir", data_dir.string(), "--listen", "127.0.0.1:" + std::to_string(FreePort())},
                std::chrono::seconds(600));
  ASSERT_EQ(demo.exit_code, 0) << demo.output;
  const std::regex precision_line(
      R"(3 workers, (bf16 \(this CPU computes it\)|fp32 \(this CPU has no bf16 units; --precision bf16 emulates them))");
  EXPECT_TRUE(std::regex_search(demo.output, precision_line)) << demo.output;

  std::smatch accuracy;
  const std::regex accuracy_line(R"(exact-match accuracy: before ([0-9.]+)%, after ([0-9.]+)%)");
  ASSERT_TRUE(std::regex_search(demo.output, accuracy, accuracy_line)) << demo.output;
  EXPECT_GT(std::stod(accuracy[2]), std::stod(accuracy[1])) << demo.output;
  for (int round = 1; round <= 6; ++round) {
    EXPECT_NE(demo.output.find("round " + std::to_string(round) + "/6 committed"), std::string::npos) << demo.output;
  }

  std::ifstream key_file(data_dir / "admin-key");
  std::string admin_key;
  key_file >> admin_key;
  ASSERT_TRUE(admin_key.starts_with("psk_")) << admin_key;
  EXPECT_EQ(demo.output.find(admin_key), std::string::npos);
  int logs = 0;
  for (const auto& entry : fs::directory_iterator(data_dir / "demo")) {
    if (entry.path().extension() != ".log") continue;
    ++logs;
    const std::string log = ReadWholeFile(entry.path());
    EXPECT_EQ(log.find(admin_key), std::string::npos) << entry.path();
  }
  EXPECT_GE(logs, 3) << "the server's and two own workers' logs";
}

}  // namespace
}  // namespace parsyn::e2e
