// Test support (header-only): a test that cannot run because something `./dev setup` installs is missing.
//
// PARSYN_SKIP_FOR_MISSING_DEPENDENCY(why) skips the test, saying `why`; with PARSYN_REQUIRE_ALL=1 in the environment
// (CI's .ci/run sets it) it fails the test instead, since there a missing dependency means a missing install step.
// Use it only for what ./dev installs (PostgreSQL, moto_server, prometheus, npm packages, the trainer), not for what
// a machine may lawfully lack (a Docker daemon, the right to mount, a GPU). Like GTEST_SKIP, it returns from the
// function it is in. The node tests have the same in tests/missing_dependency.mjs.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace parsyn::test_support {

inline bool RequireAllDependencies() {
  const char* value = std::getenv("PARSYN_REQUIRE_ALL");
  return value != nullptr && std::string_view(value) == "1";
}

}  // namespace parsyn::test_support

#define PARSYN_SKIP_FOR_MISSING_DEPENDENCY(why)                                                             \
  do {                                                                                                      \
    const std::string parsyn_missing_why = (why);                                                           \
    if (::parsyn::test_support::RequireAllDependencies()) {                                                 \
      GTEST_FAIL() << parsyn_missing_why << " (PARSYN_REQUIRE_ALL=1: a missing dependency fails the test)"; \
    }                                                                                                       \
    GTEST_SKIP() << parsyn_missing_why;                                                                     \
  } while (0)
