// parsyn audit export [--out FILE] [--actor A] [--action "METHOD ROUTE"] [--outcome O] [--since-ms T] [--until-ms T]
//             | verify FILE --key PUB [--key PUB ...]
//             | key [--out FILE]
// export pages GET /api/v1/audit oldest first and writes one record a line (JSON lines); verify checks such a file
// offline (coordinator/audit_chain.h VerifyAuditLines) and names the first broken record; key saves the PEM public key
// that signs the checkpoints (GET /api/v1/audit/key). docs/operations.md, "Audit log".
#include <fstream>
#include <iostream>

#include "base/atomic_file.h"
#include "base/text_file.h"
#include "cli/coordinator_commands.h"
#include "cli/remote.h"
#include "coordinator/audit_chain.h"

namespace parsyn::cli {
namespace {

using nlohmann::json;

struct AuditFlags {
  RemoteFlags remote;
  std::string out = "-";  // "-": stdout
  std::string actor, action, outcome;
  int64_t since_ms = 0, until_ms = 0;
  std::string file;
  std::vector<std::string> keys;
};

// `text` to stdout ("-") or, atomically, to the file `out`.
Status WriteOut(const std::string& out, const std::string& text) {
  if (out == "-") {
    std::cout << text << std::flush;
    return Status::Ok();
  }
  return WriteFileAtomically(out, text, 0644);
}

int Export(const AuditFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("audit export", client.status());
  std::string path = "/api/v1/audit?order=asc";
  auto add = [&path](const char* name, const std::string& value) {
    if (!value.empty()) path += std::string("&") + name + "=" + http::PercentEncode(value);
  };
  add("actor", f.actor);
  add("action", f.action);
  add("outcome", f.outcome);
  if (f.since_ms > 0) add("since_ms", std::to_string(f.since_ms));
  if (f.until_ms > 0) add("until_ms", std::to_string(f.until_ms));
  // Only --project narrows the export (a project's owners read its records); the default project of the
  // environment or the config file does not.
  add("project", f.remote.project);
  StatusOr<json> records = ListAll(**client, path, "records");
  if (!records.ok()) return Fail("audit export", records.status());
  std::string lines;
  for (const json& r : *records) lines += r.dump() + "\n";
  if (Status written = WriteOut(f.out, lines); !written.ok()) return Fail("audit export", written);
  std::cerr << "exported " << records->size() << " audit record(s)" << (f.out == "-" ? "" : " to " + f.out)
            << (f.actor.empty() && f.action.empty() && f.outcome.empty() && f.since_ms == 0 && f.until_ms == 0 &&
                        f.remote.project.empty()
                    ? ""
                    : " (filtered: such a file does not verify as one chain)")
            << "\n";
  return 0;
}

int Verify(const AuditFlags& f) {
  std::vector<Ed25519PublicKey> keys;
  for (const std::string& file : f.keys) {
    StatusOr<std::string> pem = ReadWholeFile(file);
    if (!pem.ok()) return Fail("audit verify", pem.status());
    StatusOr<Ed25519PublicKey> key = Ed25519PublicKey::FromPem(*pem);
    if (!key.ok())
      return Fail("audit verify",
                  "--key " + file + ": " + key.status().message() + " (save it with `parsyn audit key --out FILE`)", 2);
    keys.push_back(*std::move(key));
  }
  std::ifstream in(f.file);
  if (!in) return Fail("audit verify", "cannot read " + f.file, 2);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  StatusOr<coordinator::AuditVerification> result = coordinator::VerifyAuditLines(lines, keys);
  if (!result.ok()) {
    return Fail("audit verify", f.file + ": " + result.status().message(),
                result.status().code() == StatusCode::kDataLoss ? 1 : 2);
  }
  std::cout << "OK: records " << result->first_seq << " to " << result->last_seq << " form one unbroken chain; "
            << result->checkpoints << " checkpoint(s) verified";
  if (result->last_checkpoint_seq > 0) std::cout << ", the last at record " << result->last_checkpoint_seq;
  std::cout << "\n";
  if (result->unsigned_tail > 0) {
    std::cout << "note: the last " << result->unsigned_tail
              << " record(s) come after the last checkpoint; no signature covers them yet\n";
  }
  return 0;
}

int Key(const AuditFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("audit key", client.status());
  auto res = (*client)->Get("/api/v1/audit/key");
  if (!res.ok()) return Fail("audit key", res.status());
  StatusOr<json> key = res->Json();
  if (!key.ok()) return Fail("audit key", key.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*key);
    return 0;
  }
  if (Status written = WriteOut(f.out, key->value("public_key_pem", "")); !written.ok())
    return Fail("audit key", written);
  if (f.out != "-") std::cerr << "key " << key->value("key_id", "") << " written to " << f.out << "\n";
  return 0;
}

}  // namespace

void AddAuditCommands(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<AuditFlags>();
  CLI::App* group = SubcommandGroup(app, "audit", "the coordinator's audit log: export it, verify a copy offline");

  CLI::App* exp = group->add_subcommand("export", "write the audit log as JSON lines, oldest first");
  AddRemoteFlags(*exp, flags->remote);
  exp->add_option("--out", flags->out, "file to write (- for stdout)")->capture_default_str();
  exp->add_option("--actor", flags->actor, "only this actor's records (\"admin\", \"worker 7\", \"anonymous\")");
  exp->add_option("--action", flags->action, "only this action (\"POST /api/v1/training-jobs\")");
  exp->add_option("--outcome", flags->outcome, "only success, failure or denied")
      ->check(CLI::IsMember({"success", "failure", "denied"}));
  exp->add_option("--since-ms", flags->since_ms, "only records at or after this Unix time (ms)");
  exp->add_option("--until-ms", flags->until_ms, "only records before this Unix time (ms)");
  exp->callback([flags, &exit_code] { exit_code = Export(*flags); });

  CLI::App* verify = group->add_subcommand(
      "verify",
      "check an exported audit log offline: its hash chain and checkpoint signatures; names the first "
      "broken record (exit 1)");
  verify->add_option("file", flags->file, "the export (JSON lines)")->required();
  verify
      ->add_option("--key", flags->keys,
                   "PEM public key of a coordinator that signed checkpoints (`parsyn audit key`); repeat for "
                   "each coordinator of a failover group with keys of their own")
      ->required();
  verify->callback([flags, &exit_code] { exit_code = Verify(*flags); });

  CLI::App* key = group->add_subcommand("key", "save the public key that signs the audit log's checkpoints (PEM)");
  AddRemoteFlags(*key, flags->remote);
  key->add_option("--out", flags->out, "file to write (- for stdout)")->capture_default_str();
  key->callback([flags, &exit_code] { exit_code = Key(*flags); });
}

}  // namespace parsyn::cli
