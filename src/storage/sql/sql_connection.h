// SqlConnection: what SqlMetadataStore (sql_metadata_store.h) needs from a database, and all that differs between
// SQLite (sqlite_connection.h) and PostgreSQL (postgres_connection.h): the connection itself, prepared statements
// and their parameters, transactions and row locks, the type of an id column, error mapping, and the schema history
// each kept before the two shared one (sql_schema.h).
//
// SQL handed to Prepare() uses PostgreSQL's placeholders, $1, $2, ... (each connection rewrites them as it needs),
// and only SQL both databases accept: CAST(x AS TEXT) rather than x::text, ON CONFLICT rather than INSERT OR IGNORE,
// RETURNING id for a new row's id.
//
// Threads: a connection is not for concurrent use; SqlMetadataStore calls it under its mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "base/status.h"
#include "storage/metadata_store.h"

namespace parsyn::storage {

// The constraint a failed statement violated, for callers that turn it into a better message.
enum class SqlConstraint { kNone, kUnique, kForeignKey };

// One run of a prepared statement: binds parameters, steps through its rows, reads columns. Destroying it ends the
// run (resets the statement, drains unread rows), so at most one is alive per connection at a time.
class SqlStatement {
 public:
  virtual ~SqlStatement() = default;

  // Binds the arguments to $1, $2, ... in order. std::nullopt (or an empty optional) binds NULL.
  template <typename... Args>
  SqlStatement& Bind(const Args&... args) {
    (BindValue(args), ...);
    return *this;
  }

  // True with a row to read, false when done; the error names the statement's failure.
  virtual StatusOr<bool> Step() = 0;
  // Steps to the end: runs a statement that returns no rows, or whose remaining rows are not wanted.
  Status Run() {
    while (true) {
      PARSYN_ASSIGN_OR_RETURN(bool row, Step());
      if (!row) return Status::Ok();
    }
  }
  // Runs an INSERT ... RETURNING id to its end and returns the new row's id.
  StatusOr<int64_t> RunReturningId() {
    PARSYN_ASSIGN_OR_RETURN(bool row, Step());
    if (!row) return InternalError("INSERT ... RETURNING id returned no row");
    const int64_t id = Int(0);
    PARSYN_RETURN_IF_ERROR(Run());
    return id;
  }
  // The constraint the last failed Step() violated, if any.
  virtual SqlConstraint violated() const = 0;
  // Rows the statement (an INSERT, UPDATE or DELETE run to its end) changed.
  virtual int64_t changes() const = 0;

  virtual bool IsNull(int col) const = 0;
  virtual int64_t Int(int col) const = 0;       // 0 for NULL
  virtual double Real(int col) const = 0;       // 0 for NULL
  virtual bool Bool(int col) const = 0;         // false for NULL
  virtual std::string Text(int col) const = 0;  // "" for NULL
  std::optional<int64_t> OptInt(int col) const { return IsNull(col) ? std::nullopt : std::optional(Int(col)); }
  std::optional<double> OptReal(int col) const { return IsNull(col) ? std::nullopt : std::optional(Real(col)); }

 protected:
  virtual void BindNull() = 0;
  virtual void BindInt(int64_t value) = 0;
  virtual void BindReal(double value) = 0;
  virtual void BindBool(bool value) = 0;
  virtual void BindText(std::string_view value) = 0;

 private:
  template <typename T>
  void BindValue(const T& value) {
    if constexpr (std::is_same_v<T, std::nullopt_t>) {
      BindNull();
    } else if constexpr (std::is_same_v<T, bool>) {
      BindBool(value);
    } else if constexpr (std::is_integral_v<T>) {
      BindInt(static_cast<int64_t>(value));
    } else if constexpr (std::is_floating_point_v<T>) {
      BindReal(value);
    } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
      BindText(std::string_view(value));
    } else if (value) {  // std::optional<U>
      BindValue(*value);
    } else {
      BindNull();
    }
  }
};

class SqlConnection {
 public:
  virtual ~SqlConnection() = default;

  // Called at the start of every store call: PostgreSQL reconnects if the server dropped the connection and rolls
  // back what an earlier call left open; SQLite has nothing to do.
  virtual Status EnsureReady() = 0;
  // A run of the statement `sql` ($n placeholders), prepared on first use and cached by its text.
  virtual StatusOr<std::unique_ptr<SqlStatement>> Prepare(std::string_view sql) = 0;
  // Runs `sql` (one or more statements, no parameters, rows ignored); `context` starts the error's message.
  virtual Status Exec(std::string_view sql, std::string_view context) = 0;

  // Transactions. SQLite's BEGIN IMMEDIATE takes the file's write lock at once; PostgreSQL's BEGIN is READ
  // COMMITTED, and callers lock the rows they read before writing (RowLock()).
  virtual Status Begin() = 0;
  virtual Status Commit() = 0;
  virtual Status Rollback() = 0;  // a no-op outside a transaction
  // Commits since the connection was made (SQLite counts every statement outside a transaction as one).
  virtual int64_t commits() const = 0;

  // Appended to a SELECT that a transaction reads before it writes: " FOR UPDATE" (PostgreSQL; two coordinators on
  // one database queue on the row) or "" (SQLite: BEGIN IMMEDIATE already serialises writers).
  virtual std::string_view RowLock() const = 0;
  // As RowLock(), for rows that must only not change until the commit: " FOR SHARE" or "".
  virtual std::string_view SharedRowLock() const = 0;
  // An ORDER BY collation that orders text by bytes: SQLite's default, PostgreSQL's COLLATE "C".
  virtual std::string_view ByteOrder() const = 0;
  // The column type of a table's id, assigned on insert and never reused.
  virtual std::string_view AutoIdType() const = 0;

  // In a transaction: serialises schema migrations across processes (PostgreSQL's advisory lock; SQLite's write lock
  // is already held).
  virtual Status LockSchema() = 0;
  // The schema steps this kind of database took before the shared history (sql_schema.h), as they were numbered in
  // its old `schema_version` table (2, 3, ...), and the SQL that brings the last of them to the shared version 1.
  virtual std::span<const Migration> LegacyMigrations() const = 0;
  virtual std::string_view LegacyToSharedSql() const = 0;

  // The database, for messages: "database /var/lib/parsyn/meta.db", "PostgreSQL database host:5432 (...)".
  virtual std::string Describe() const = 0;
};

// BEGIN ... COMMIT on `db`, rolled back when it goes out of scope uncommitted.
class SqlTransaction {
 public:
  explicit SqlTransaction(SqlConnection& db) : db_(db) {}
  ~SqlTransaction() {
    if (open_) db_.Rollback().IgnoreError();  // a failed rollback leaves nothing to do
  }
  SqlTransaction(const SqlTransaction&) = delete;
  SqlTransaction& operator=(const SqlTransaction&) = delete;

  Status Begin() {
    PARSYN_RETURN_IF_ERROR(db_.Begin());
    open_ = true;
    return Status::Ok();
  }
  bool open() const { return open_; }
  Status Commit() {
    PARSYN_RETURN_IF_ERROR(db_.Commit());  // on failure the destructor rolls back (PostgreSQL already has)
    open_ = false;
    return Status::Ok();
  }
  // Commit() if Begin() was called, else OK: for writes that take a transaction only when fenced.
  Status CommitIfBegun() { return open_ ? Commit() : Status::Ok(); }

 private:
  SqlConnection& db_;
  bool open_ = false;
};

}  // namespace parsyn::storage
