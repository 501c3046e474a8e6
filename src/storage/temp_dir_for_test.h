// A fresh directory named parsyn-storage-<random> under the temp dir, removed with everything in it when the object
// goes away. Tests and benchmarks only; the contract is test_support::TempDir's.
#pragma once

#include "base/testing/temp_dir.h"

namespace parsyn::storage {

class TempDirForTest : public test_support::TempDir {
 public:
  TempDirForTest() : TempDir("parsyn-storage") {}
};

}  // namespace parsyn::storage
