// Test support for gtest tests of the PostgreSQL store: PARSYN_NEW_DATABASE_OR_SKIP(url) declares `url`, a fresh
// database on the test process's shared server (postgres_for_test.h), or skips the test saying why no server can run.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "base/testing/missing_dependency.h"
#include "storage/postgres_for_test.h"

// Skips the test, saying why, where no PostgreSQL can be started; else the URL of a fresh database.
#define PARSYN_NEW_DATABASE_OR_SKIP(url)                                                                        \
  std::string url;                                                                                              \
  do {                                                                                                          \
    if (std::optional<std::string> why = PostgresUnavailableReason()) PARSYN_SKIP_FOR_MISSING_DEPENDENCY(*why); \
    StatusOr<PostgresForTest*> server = SharedPostgres();                                                       \
    ASSERT_TRUE(server.ok()) << server.status().ToString();                                                     \
    StatusOr<std::string> created = (*server)->NewDatabase();                                                   \
    ASSERT_TRUE(created.ok()) << created.status().ToString();                                                   \
    url = *created;                                                                                             \
  } while (0)
