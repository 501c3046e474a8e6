// Test support: rows as builds before the shared SQL schema (sql/sql_schema.h) wrote them, for the tests that open
// such old SQLite files and PostgreSQL databases with today's store and read the rows back.
#pragma once

#include <string_view>

#include "storage/metadata_store.h"

namespace parsyn::storage {

// INSERTs of one record of every kind (a dataset; a model with a file; a worker; a running job with an artifact, a
// shard, a committed round 1 with its participant and update; three metric points; two events; the admin key hash),
// in the columns both databases' first schema version had, so they run on either at version 1. Ids come from the
// database (1 each).
extern const std::string_view kLegacyRowsSql;

// Checks (gtest EXPECTs) that `store` returns every record of kLegacyRowsSql as it was written, and that it still
// takes writes that get new ids after the old ones (metric point 4, job 2, event 3).
void ExpectLegacyRowsReadBack(MetadataStore& store);

}  // namespace parsyn::storage
