// The contract every MetadataStore implementation passes: a parameterised GoogleTest suite.
//
// A backend's test file instantiates it:
//   INSTANTIATE_TEST_SUITE_P(Sqlite, MetadataStoreContractTest, ::testing::Values(MetadataStoreBackend{...}),
//                            MetadataStoreBackendName);
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "storage/metadata_store.h"
#include "storage/temp_dir_for_test.h"

namespace parsyn::storage {

struct MetadataStoreBackend {
  std::string name;
  // Opens the store that belongs to `scratch_dir` (an empty directory per test). Called again with the same
  // directory, it must reopen the same data when `persistent` (the reopen tests are skipped otherwise).
  std::function<StatusOr<std::unique_ptr<MetadataStore>>(const std::filesystem::path& scratch_dir)> open;
  bool persistent = true;
  // Why the backend cannot run on this machine (a server that is not installed), with how to fix it: the tests are
  // then skipped with that message. Empty, or returning nullopt: it can.
  std::function<std::optional<std::string>()> unavailable;
};

// Prints the backend's name in test output instead of its bytes.
inline void PrintTo(const MetadataStoreBackend& backend, std::ostream* os) { *os << backend.name; }

std::string MetadataStoreBackendName(const ::testing::TestParamInfo<MetadataStoreBackend>& info);

class MetadataStoreContractTest : public ::testing::TestWithParam<MetadataStoreBackend> {
 protected:
  void SetUp() override;
  MetadataStore& store() { return *store_; }
  // Closes the store and opens it again from the same scratch directory.
  void Reopen();

  // Fixtures: a dataset, a model, workers and a job, with ids the store assigned.
  Dataset AddDataset(std::string blob_key = "datasets/1.jsonl");
  Model AddModel();
  Worker AddWorker(std::string name);
  TrainingJob AddRunningJob(const Dataset& dataset, const Model& model);

 private:
  TempDirForTest scratch_;
  std::unique_ptr<MetadataStore> store_;
};

}  // namespace parsyn::storage
