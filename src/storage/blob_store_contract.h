// The contract every BlobStore implementation passes: a parameterised GoogleTest suite.
//
// A backend's test file instantiates it with a factory:
//   INSTANTIATE_TEST_SUITE_P(Directory, BlobStoreContractTest,
//                            ::testing::Values(BlobStoreBackend{"directory", [](const fs::path& dir) {...}}),
//                            BlobStoreBackendName);
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>

#include "storage/blob_store.h"
#include "storage/temp_dir_for_test.h"

namespace parsyn::storage {

struct BlobStoreBackend {
  std::string name;
  // Makes a fresh, empty store. `scratch_dir` is an empty directory that lives as long as the test, for backends
  // that keep files; others ignore it.
  std::function<StatusOr<std::unique_ptr<BlobStore>>(const std::filesystem::path& scratch_dir)> make;
};

// For INSTANTIATE_TEST_SUITE_P's name generator.
// Prints the backend's name in test output instead of its bytes.
inline void PrintTo(const BlobStoreBackend& backend, std::ostream* os) { *os << backend.name; }

std::string BlobStoreBackendName(const ::testing::TestParamInfo<BlobStoreBackend>& info);

// Stores `bytes` under `key` (the contract's and the backends' own tests).
StatusOr<BlobInfo> PutString(BlobStore& store, std::string_view key, std::string bytes, const PutOptions& options = {});
// The bytes under `key`, or "<status>" when they cannot be read.
std::string GetString(BlobStore& store, std::string_view key);

class BlobStoreContractTest : public ::testing::TestWithParam<BlobStoreBackend> {
 protected:
  void SetUp() override;
  BlobStore& store() { return *store_; }

 private:
  TempDirForTest scratch_;
  std::unique_ptr<BlobStore> store_;
};

}  // namespace parsyn::storage
