#include "storage/sql/postgres_connection.h"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "base/log.h"
#include "storage/disk_full.h"
#include "storage/postgres_store.h"

namespace parsyn::storage {
namespace {

// PostgreSQL's schema_version 2..6, before the shared history (its version 1 is in postgres_store_test.cc, which
// builds old databases from it). Kept as they shipped: databases at any of those versions are brought forward
// through them.
constexpr Migration kPostgresLegacyMigrations[] = {
    // Version 2: each shard's label histogram (distributed.partition); '' for older jobs' shards.
    {2, "ALTER TABLE shards ADD COLUMN label_histogram TEXT NOT NULL DEFAULT '';"},
    // Version 3: the coordinator lease (failover): one row, the leader's id and URL, its fencing epoch and the
    // expiry, by the database's clock.
    {3,
     "CREATE TABLE coordinator_lease (id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, "
     "holder_url TEXT NOT NULL, epoch BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL);"},
    // Version 4: the trainers each worker last announced (its hello's "trainers", JSON text); '' before any.
    {4, "ALTER TABLE workers ADD COLUMN trainers_json TEXT NOT NULL DEFAULT '';"},
    // Version 5: each job's private seed (storage::TrainingJob::private_seed), drawn for the jobs already stored.
    {5,
     "ALTER TABLE jobs ADD COLUMN private_seed TEXT NOT NULL DEFAULT '';"
     "UPDATE jobs SET private_seed = "
     "encode(sha256((gen_random_uuid()::text || gen_random_uuid()::text)::bytea), 'hex');"},
    // Version 6: a job's events of one type (its warnings) are read through an index.
    {6, "CREATE INDEX job_events_by_type ON job_events(job_id, type, id);"},
};

// PostgreSQL's version 6 is the shared version 1 already (metric points had their id from its version 1 on).
constexpr std::string_view kPostgresLegacyToShared = "SELECT 1;";

// SQLSTATEs the store acts on (PostgreSQL appendix A).
constexpr std::string_view kUniqueViolation = "23505";
constexpr std::string_view kForeignKeyViolation = "23503";

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using ResultPtr = std::unique_ptr<PGresult, ResultDeleter>;

std::string Trimmed(const char* text) {
  std::string s = text ? text : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string Scrub(std::string text, const std::string& secret) {
  if (secret.empty()) return text;
  for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at)) {
    text.replace(at, secret.size(), "***");
  }
  return text;
}

// Where the URL's passwords are (offset, length each), as written (still percent-encoded): the one of
// scheme://USER:PASSWORD@HOST... and any ?password=... or &password=... query value.
std::vector<std::pair<size_t, size_t>> PasswordSpans(std::string_view uri) {
  std::vector<std::pair<size_t, size_t>> spans;
  size_t scheme = uri.find("://");
  if (scheme == std::string_view::npos) return spans;
  size_t authority = scheme + 3;
  size_t end = uri.find_first_of("/?", authority);
  if (end == std::string_view::npos) end = uri.size();
  size_t at = uri.rfind('@', end);
  size_t colon = uri.find(':', authority);
  if (at != std::string_view::npos && at >= authority && colon != std::string_view::npos && colon < at) {
    spans.emplace_back(colon + 1, at - colon - 1);
  }
  for (size_t query = uri.find('?', authority); query != std::string_view::npos; query = uri.find('&', query + 1)) {
    constexpr std::string_view kKey = "password=";
    if (uri.substr(query + 1, kKey.size()) != kKey) continue;
    size_t value = query + 1 + kKey.size();
    size_t value_end = uri.find('&', value);
    if (value_end == std::string_view::npos) value_end = uri.size();
    spans.emplace_back(value, value_end - value);
  }
  return spans;
}

// `text` with every password of `uri`, as written there, replaced by *** (libpq quotes a URL it cannot parse as
// written; the connection's own messages are scrubbed of the decoded password it connected with).
std::string ScrubPasswords(std::string text, std::string_view uri) {
  for (auto [offset, length] : PasswordSpans(uri)) {
    if (length != 0) text = Scrub(std::move(text), std::string(uri.substr(offset, length)));
  }
  return text;
}

StatusOr<PostgresTarget> ParseTarget(std::string_view uri) {
  char* error = nullptr;
  const std::string text(uri);
  PQconninfoOption* options = PQconninfoParse(text.c_str(), &error);
  if (options == nullptr) {
    // libpq quotes the URL it could not parse: its password goes, whatever the parse got to.
    std::string why = ScrubPasswords(error ? Trimmed(error) : "out of memory", uri);
    PQfreemem(error);
    return InvalidArgumentError("metadata store URL " + RedactPostgresUri(uri) + " is not a valid PostgreSQL URL (" +
                                why + "); expected postgres://USER:PASSWORD@HOST:PORT/DATABASE");
  }
  PostgresTarget target;
  for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    if (o->val == nullptr || *o->val == '\0') continue;
    std::string_view key = o->keyword;
    if (key == "host" || (key == "hostaddr" && target.host == "localhost")) target.host = o->val;
    if (key == "port") target.port = o->val;
    if (key == "dbname") target.dbname = o->val;
    if (key == "user") target.user = o->val;
    if (key == "password") target.password = o->val;
  }
  PQconninfoFree(options);
  if (target.dbname.empty()) {
    return InvalidArgumentError("metadata store URL " + RedactPostgresUri(uri) +
                                " names no database; expected postgres://USER:PASSWORD@HOST:PORT/DATABASE");
  }
  return target;
}

// A double as PostgreSQL reads it back exactly (shortest round-trip form).
std::string DoubleText(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return "NaN";
  return std::string(buf, end);
}

}  // namespace

std::string PostgresTarget::Describe() const {
  std::string s = host + ":" + port;
  if (!dbname.empty()) s += " (database " + dbname + (user.empty() ? "" : ", user " + user) + ")";
  return s;
}

bool IsPostgresUri(std::string_view uri) { return uri.starts_with("postgres://") || uri.starts_with("postgresql://"); }

std::string RedactPostgresUri(std::string_view uri) {
  std::string redacted;
  size_t copied = 0;
  for (auto [offset, length] : PasswordSpans(uri)) {
    if (length == 0) continue;
    redacted += std::string(uri.substr(copied, offset - copied)) + "***";
    copied = offset + length;
  }
  return redacted + std::string(uri.substr(copied));
}

namespace {

// One run of a prepared statement: binds parameters (as text), sends it, and reads the rows one at a time
// (single-row mode). The destructor drains what was not read, so the connection is free for the next statement.
class PostgresStatement final : public SqlStatement {
 public:
  PostgresStatement(PostgresConnection* db, std::string name) : db_(db), name_(std::move(name)) {}
  ~PostgresStatement() override { Drain(); }
  PostgresStatement(const PostgresStatement&) = delete;
  PostgresStatement& operator=(const PostgresStatement&) = delete;

  StatusOr<bool> Step() override {
    if (!sent_) PARSYN_RETURN_IF_ERROR(Send());
    row_.reset();
    while (true) {
      ResultPtr result(PQgetResult(db_->get()));
      if (result == nullptr) {
        done_ = true;
        return false;
      }
      switch (PQresultStatus(result.get())) {
        case PGRES_SINGLE_TUPLE: row_ = std::move(result); return true;
        case PGRES_TUPLES_OK:  // the end of the rows
          break;
        case PGRES_COMMAND_OK: {
          const char* tuples = PQcmdTuples(result.get());
          changes_ = tuples && *tuples ? std::strtoll(tuples, nullptr, 10) : 0;
          break;
        }
        default:
          if (error_.ok()) {
            const char* state = PQresultErrorField(result.get(), PG_DIAG_SQLSTATE);
            std::string_view code = state ? state : "";
            if (code == kUniqueViolation) violated_ = SqlConstraint::kUnique;
            if (code == kForeignKeyViolation) violated_ = SqlConstraint::kForeignKey;
            error_ = db_->Error(result.get(), "postgres statement failed");
          }
          break;
      }
      // Keep reading until libpq returns nullptr: the statement is only over then.
      if (!error_.ok()) {
        Drain();
        return error_;
      }
    }
  }
  SqlConstraint violated() const override { return violated_; }
  int64_t changes() const override { return changes_; }

  bool IsNull(int col) const override { return PQgetisnull(row_.get(), 0, col) != 0; }
  int64_t Int(int col) const override {
    return IsNull(col) ? 0 : std::strtoll(PQgetvalue(row_.get(), 0, col), nullptr, 10);
  }
  double Real(int col) const override {
    if (IsNull(col)) return 0;
    const char* text = PQgetvalue(row_.get(), 0, col);
    double v = 0;
    auto [end, ec] = std::from_chars(text, text + std::strlen(text), v);
    if (ec != std::errc()) v = std::strtod(text, nullptr);  // "Infinity", "-Infinity"
    return v;
  }
  bool Bool(int col) const override { return !IsNull(col) && PQgetvalue(row_.get(), 0, col)[0] == 't'; }
  std::string Text(int col) const override {
    if (IsNull(col)) return "";
    return std::string(PQgetvalue(row_.get(), 0, col), PQgetlength(row_.get(), 0, col));
  }

 protected:
  void BindNull() override { params_.emplace_back(std::nullopt); }
  void BindInt(int64_t value) override { params_.emplace_back(std::to_string(value)); }
  void BindReal(double value) override { params_.emplace_back(DoubleText(value)); }
  void BindBool(bool value) override { params_.emplace_back(value ? "true" : "false"); }
  void BindText(std::string_view value) override { params_.emplace_back(std::string(value)); }

 private:
  Status Send() {
    sent_ = true;
    std::vector<const char*> values;
    for (const std::optional<std::string>& p : params_) values.push_back(p ? p->c_str() : nullptr);
    if (!PQsendQueryPrepared(db_->get(), name_.c_str(), static_cast<int>(values.size()), values.data(), nullptr,
                             nullptr, 0)) {
      done_ = true;
      return db_->Error(nullptr, "sending a statement");
    }
    // Rows come one PGresult each: a long list is never buffered whole by libpq.
    PQsetSingleRowMode(db_->get());
    return Status::Ok();
  }

  void Drain() {
    if (!sent_ || done_) return;
    while (PGresult* r = PQgetResult(db_->get())) PQclear(r);
    done_ = true;
  }

  PostgresConnection* db_;
  std::string name_;
  std::vector<std::optional<std::string>> params_;
  bool sent_ = false;
  bool done_ = false;
  ResultPtr row_;
  Status error_ = Status::Ok();
  SqlConstraint violated_ = SqlConstraint::kNone;
  int64_t changes_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<PostgresConnection>> PostgresConnection::Open(std::string_view uri) {
  PARSYN_ASSIGN_OR_RETURN(PostgresTarget target, ParseTarget(uri));
  std::unique_ptr<PostgresConnection> db(new PostgresConnection(std::string(uri), std::move(target)));
  PARSYN_RETURN_IF_ERROR(db->Connect());
  return db;
}

PostgresConnection::~PostgresConnection() = default;

Status PostgresConnection::Connect() {
  // connect_timeout and the application name apply unless the URL sets them (its values come later and win).
  const char* keywords[] = {"connect_timeout", "fallback_application_name", "client_encoding", "dbname", nullptr};
  const char* values[] = {"10", "parsyn", "UTF8", uri_.c_str(), nullptr};
  conn_.reset(PQconnectdbParams(keywords, values, /*expand_dbname=*/1));
  statements_.clear();
  if (conn_ == nullptr) return UnavailableError("connecting to PostgreSQL " + target_.Describe() + ": out of memory");
  if (PQstatus(conn_.get()) != CONNECTION_OK) {
    std::string why = Scrub(Trimmed(PQerrorMessage(conn_.get())), target_.password);
    return UnavailableError("cannot connect to the PostgreSQL metadata store at " + target_.Describe() + ": " + why);
  }
  // Notices (e.g. "relation already exists, skipping") are not for the coordinator's log.
  PQsetNoticeProcessor(
      conn_.get(), [](void*, const char*) {}, nullptr);
  return Status::Ok();
}

// Reconnects when the server dropped the connection (restart, failover, idle timeout), and rolls back what a
// previous call left open.
Status PostgresConnection::EnsureReady() {
  if (conn_ == nullptr || PQstatus(conn_.get()) != CONNECTION_OK) {
    PARSYN_LOG_WARN("metadata store: reconnecting to PostgreSQL {}", target_.Describe());
    return Connect();
  }
  return Rollback();
}

Status PostgresConnection::Error(const PGresult* result, std::string_view context) const {
  const char* state = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
  std::string why = Trimmed(result ? PQresultErrorMessage(result) : PQerrorMessage(conn_.get()));
  if (why.empty()) why = Trimmed(PQerrorMessage(conn_.get()));
  why = Scrub(std::move(why), target_.password);
  std::string message = std::string(context) + ": " + why;
  if (state != nullptr) message += " (sqlstate " + std::string(state) + ")";
  if (PQstatus(conn_.get()) != CONNECTION_OK) {
    return UnavailableError("lost the connection to the PostgreSQL metadata store at " + target_.Describe() + ": " +
                            message);
  }
  std::string_view code = state ? state : "";
  if (code == kUniqueViolation) return AlreadyExistsError(std::move(message));
  if (code == kForeignKeyViolation) return FailedPreconditionError(std::move(message));
  if (code == "53100") return DiskFullError("PostgreSQL " + target_.Describe(), message);  // disk_full
  if (code.starts_with("23") || code.starts_with("22")) return InvalidArgumentError(std::move(message));
  // Connection trouble, out of resources, shutting down, serialization failures and deadlocks, read-only standby:
  // transient, for the caller to retry.
  if (code.starts_with("08") || code.starts_with("53") || code.starts_with("57") || code.starts_with("40") ||
      code == "25006") {
    return UnavailableError(std::move(message));
  }
  if (code == "XX001" || code == "XX002") return DataLossError(std::move(message));
  return InternalError(std::move(message));
}

Status PostgresConnection::Exec(std::string_view sql, std::string_view context) {
  ResultPtr result(PQexec(conn_.get(), std::string(sql).c_str()));
  ExecStatusType status = result ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return Error(result.get(), context);
  return Status::Ok();
}

StatusOr<std::unique_ptr<SqlStatement>> PostgresConnection::Prepare(std::string_view sql) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    std::string name = "parsyn_" + std::to_string(statements_.size() + 1);
    ResultPtr result(PQprepare(conn_.get(), name.c_str(), std::string(sql).c_str(), 0, nullptr));
    if (!result || PQresultStatus(result.get()) != PGRES_COMMAND_OK) {
      return Error(result.get(), "preparing '" + std::string(sql) + "'");
    }
    it = statements_.emplace(std::string(sql), std::move(name)).first;
  }
  return std::unique_ptr<SqlStatement>(std::make_unique<PostgresStatement>(this, it->second));
}

Status PostgresConnection::Commit() {
  PARSYN_RETURN_IF_ERROR(Exec("COMMIT", "committing"));  // a failed COMMIT has rolled back
  commits_.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

Status PostgresConnection::Rollback() {
  if (PQtransactionStatus(conn_.get()) == PQTRANS_IDLE) return Status::Ok();
  return Exec("ROLLBACK", "rolling back");
}

// Serialises migrations of one database across processes (pg_advisory_xact_lock's key: "parsyn" in ASCII).
Status PostgresConnection::LockSchema() {
  constexpr int64_t kMigrationLockKey = 0x70617273796e;
  return Exec("SELECT pg_advisory_xact_lock(" + std::to_string(kMigrationLockKey) + ")", "locking the schema");
}

std::span<const Migration> PostgresLegacyMigrations() { return kPostgresLegacyMigrations; }

std::span<const Migration> PostgresConnection::LegacyMigrations() const { return kPostgresLegacyMigrations; }

std::string_view PostgresConnection::LegacyToSharedSql() const { return kPostgresLegacyToShared; }

}  // namespace parsyn::storage
