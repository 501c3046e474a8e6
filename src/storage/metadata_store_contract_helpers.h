// The metadata store contract's helpers (metadata_store_contract.cc and metadata_store_contract_rounds.cc): values
// that must be OK, the rounds, commits and failures the tests record, and the commit count of the store under test.
#pragma once

#include <gmock/gmock.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "storage/faulty_metadata_store.h"
#include "storage/metadata_store.h"
#include "storage/postgres_store.h"
#include "storage/sqlite_store.h"
#include "storage/timed_metadata_store.h"

namespace parsyn::storage::contract {
inline constexpr int64_t kT0 = 1'700'000'000'000;

// Transactions the store under the wrappers has committed so far.
inline int64_t CommitsOf(MetadataStore& store) {
  if (auto* faulty = dynamic_cast<FaultyMetadataStore*>(&store)) return CommitsOf(faulty->inner());
  if (auto* timed = dynamic_cast<TimedMetadataStore*>(&store)) return CommitsOf(timed->inner());
  if (auto* sqlite = dynamic_cast<SqliteMetadataStore*>(&store)) return sqlite->commits();
  if (auto* postgres = dynamic_cast<PostgresMetadataStore*>(&store)) return postgres->commits();
  throw std::runtime_error("no commit count for this store");
}

#define ASSERT_OK(expr)                                                  \
  do {                                                                   \
    ::parsyn::Status assert_ok_status_ = (expr);                         \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_.ToString(); \
  } while (0)

// The value of a StatusOr that must be OK in this test.
template <typename T>
T Must(StatusOr<T> s) {
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) throw std::runtime_error(s.status().ToString());  // ends the test; gtest reports it
  return std::move(s).value();
}

inline Round NewRound(int64_t job_id, int32_t round, int32_t attempt, std::vector<int64_t> participants) {
  Round r;
  r.job_id = job_id;
  r.round = round;
  r.attempt = attempt;
  r.participants = std::move(participants);
  r.started_at_ms = kT0 + round * 1000 + attempt;
  return r;
}

inline RoundCommit NewCommit(int64_t job_id, int32_t round, int32_t attempt) {
  RoundCommit c;
  c.job_id = job_id;
  c.round = round;
  c.attempt = attempt;
  c.global_blob_key = "jobs/" + std::to_string(job_id) + "/rounds/" + std::to_string(round) + "/global.safetensors";
  c.global_sha256 = std::string(64, 'a' + static_cast<char>(round % 6));
  c.ended_at_ms = kT0 + round * 1000 + 500;
  c.train_loss = 2.5 - round * 0.25;
  c.previous_global_validation_loss = 2.75 - round * 0.25;
  c.bytes_down = 1000 * round;
  c.bytes_up = 300 * round;
  return c;
}

inline RoundFailure NewFailure(int64_t job_id, int32_t round, int32_t attempt) {
  RoundFailure f;
  f.job_id = job_id;
  f.round = round;
  f.attempt = attempt;
  f.reason = "1 of min_workers 2 reported within aggregation_timeout";
  f.ended_at_ms = kT0 + round * 1000 + 900;
  f.bytes_down = 7;
  f.bytes_up = 5;
  return f;
}

}  // namespace parsyn::storage::contract
