// The metadata store's SQL schema, one history for SQLite and PostgreSQL, and the code that brings a database to it.
//
// The version applied is kept in the table `parsyn_schema_version`; MigrateSchema() applies the missing steps in
// order, each in its own transaction together with its version bump (under the connection's schema lock), so a crash
// mid-migration leaves the previous version. A step's SQL is written once for both databases; "{auto_id}" in it
// stands for the connection's id column type (SqlConnection::AutoIdType).
//
// Before this history each database kept its own, numbered in a table `schema_version` (SQLite 1..7, PostgreSQL
// 1..6). A database found at one of those versions is first brought forward through its own old steps
// (SqlConnection::LegacyMigrations, LegacyToSharedSql), in one transaction, and then stands at shared version 1.
// `schema_version` is left holding kRetiredLegacySchemaVersion, which builds from before the shared history refuse
// as newer than theirs.
#pragma once

#include <span>

#include "storage/metadata_store.h"
#include "storage/sql/sql_connection.h"

namespace parsyn::storage {

// What `schema_version` holds once a database follows the shared history.
inline constexpr int kRetiredLegacySchemaVersion = 1000;

// The shared schema this build uses, in order.
std::span<const Migration> SqlMigrations();

// Brings the database to the last of `migrations` (tests may pass their own list, numbered 1..n). FailedPrecondition
// if its schema is newer than that (written by a newer build); Internal naming the version if a step fails (nothing
// of it is kept) or the list is not numbered 1..n.
Status MigrateSchema(SqlConnection& db, std::span<const Migration> migrations);

// The version of the shared schema the database has; 0 before the first step.
StatusOr<int> ReadSchemaVersion(SqlConnection& db);

}  // namespace parsyn::storage
