// Credentials of the coordinator: the admin API key (users, the CLI), worker tokens, the signed-URL secret.
//
// Secrets are 32 random bytes from the OS, hex-encoded with a readable prefix ("psk_" admin key, "pwt_" worker
// token). Only their sha256 is stored in the metadata store; the admin key is also written once, mode 0600, to
// <data_dir>/admin-key so the local CLI can find it. The URL-signing secret lives in <data_dir>/url-signing-secret
// (0600) so signed URLs stay valid across restarts.
//
// Mutual TLS (`parsyn server --client-ca`): a worker's client certificate names it as "worker-<id>" (the subject CN,
// or the first DNS subjectAltName when there is no CN: http::Request::client_identity); the worker routes and the
// worker-bound blob URLs refuse a request whose certificate is missing or names another worker, so a stolen token
// is useless without the worker's private key. IssueWorkerCertificate makes such a certificate from an operator's CA.
// Functions here are safe from any thread; those touching files or the store block (call them off the loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "base/status.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

// "<prefix><64 hex digits>" from getrandom(). Unavailable if the OS has no randomness to give.
StatusOr<std::string> NewSecret(std::string_view prefix);
// Lowercase hex sha256 of a key or token: what the store keeps.
std::string HashSecret(std::string_view secret);

struct AdminKeySetup {
  std::optional<std::string> new_key;  // set only on the first start: print it once
};
// Creates the admin key on first start (stored hashed; written to <data_dir>/admin-key, 0600, create-only).
// Later starts change nothing. Unavailable on file or store errors.
StatusOr<AdminKeySetup> EnsureAdminKey(storage::MetadataStore& store, const std::filesystem::path& data_dir);
// The admin key from an operator's file (`parsyn server --admin-key-file`, e.g. a mounted Kubernetes Secret): its
// hash replaces the stored one when it differs, so changing the file rotates the key at the next start. Nothing is
// written to <data_dir>/admin-key. InvalidArgument naming the flag when the file is unreadable or the key too short.
Status UseAdminKeyFile(storage::MetadataStore& store, const std::filesystem::path& file);
// A key an operator keeps in a file (surrounding whitespace trimmed): at least 32 characters. InvalidArgument naming
// `flag` and how to make one otherwise.
StatusOr<std::string> ReadOperatorKeyFile(const std::filesystem::path& file, std::string_view flag);
// Reads <data_dir>/url-signing-secret, creating it (0600) on first start.
StatusOr<std::string> LoadOrCreateSigningSecret(const std::filesystem::path& data_dir);

// The token of an "Authorization: Bearer <token>" header. Unauthenticated naming what is wrong when the header is
// missing or not a bearer credential.
StatusOr<std::string> BearerToken(std::string_view authorization_header);
// Constant-time comparison of two digests (OpenSSL CRYPTO_memcmp); false when their lengths differ. Worker tokens are
// found by their sha256 in a map: comparing digests of a guess reveals nothing of a token through timing.
bool DigestsEqual(std::string_view a, std::string_view b);

// The registered workers' tokens (by sha256) and whether each worker is revoked, looked up both ways in O(1): by a
// presented token (every worker call) and by worker id (every blob transfer on a worker-bound URL; at 10,000 workers
// a scan of the tokens for each was 12% of the coordinator's CPU in a round). Not thread-safe: the service's loop
// owns it.
class WorkerTokens {
 public:
  struct Entry {
    int64_t worker_id = 0;
    bool revoked = false;
    // An own worker's project; std::nullopt for a managed one, which serves every project.
    std::optional<int64_t> project_id;
  };
  // Replaces every entry with the store's workers.
  void Reset(std::span<const storage::Worker> workers);
  void Add(const storage::Worker& worker);
  // Marks the worker revoked (unknown workers count as revoked already).
  void Revoke(int64_t worker_id);
  // The worker a token's sha256 belongs to; nullptr when none does.
  const Entry* Find(std::string_view token_sha256) const;
  // True for revoked workers and for ids no token belongs to.
  bool Revoked(int64_t worker_id) const;
  // Whether the worker may train project `project_id`'s jobs: a managed worker serves every project, an own one its
  // own. False for ids no token belongs to.
  bool ServesProject(int64_t worker_id, int64_t project_id) const;
  // What the dashboard's stream files the worker's changes under: its project, or 0 (every project's) for a managed
  // or unknown worker.
  int64_t FeedProject(int64_t worker_id) const;

 private:
  // Hashed, not ordered: a lookup in 10,000 tokens by an ordered map compared ~14 64-character digests. Looked up
  // by string_view without a copy of the digest (a transparent hash).
  struct DigestHash {
    using is_transparent = void;
    size_t operator()(std::string_view digest) const { return std::hash<std::string_view>{}(digest); }
  };
  std::unordered_map<std::string, int64_t, DigestHash, std::equal_to<>> worker_by_token_sha256_;
  std::unordered_map<int64_t, Entry> by_worker_;
};

// The identity a client certificate of worker `worker_id` carries: "worker-<id>".
std::string WorkerCertificateIdentity(int64_t worker_id);
// The mutual-TLS check of a worker request: OK when `client_identity` (the verified certificate's identity,
// http::Request::client_identity) is WorkerCertificateIdentity(worker_id). Unauthenticated without a certificate,
// PermissionDenied when it names someone else; both messages say what the worker must present.
Status CheckWorkerCertificate(const std::optional<std::string>& client_identity, int64_t worker_id);

struct IssuedCertificate {
  std::string certificate_pem;  // the worker's certificate, signed by the CA
  std::string private_key_pem;  // its new private key (PKCS#8, unencrypted): keep it 0600
  std::string identity;         // WorkerCertificateIdentity(worker_id), the subject CN
  int64_t not_after_unix_s = 0;
};
// A new key (ECDSA P-256) and a certificate for worker `worker_id`, signed with the CA in `ca_cert_file` and
// `ca_key_file` (PEM; the key unencrypted): CN "worker-<id>", client authentication only, valid from a few minutes
// ago for `validity`. InvalidArgument naming the file when the CA cannot be read, is not a CA, or the key is not
// the certificate's.
StatusOr<IssuedCertificate> IssueWorkerCertificate(const std::filesystem::path& ca_cert_file,
                                                   const std::filesystem::path& ca_key_file, int64_t worker_id,
                                                   std::chrono::hours validity = std::chrono::hours(24 * 365));
// A certificate as IssueWorkerCertificate's for the public key of `request_pem` (a PEM certificate signing request
// whose signature must verify; its subject is ignored): a worker pod's bootstrap under mutual TLS. private_key_pem is
// empty (the key stays with the worker). InvalidArgument naming what is wrong with the request or the CA.
StatusOr<IssuedCertificate> SignWorkerCertificateRequest(const std::filesystem::path& ca_cert_file,
                                                         const std::filesystem::path& ca_key_file,
                                                         std::string_view request_pem, int64_t worker_id,
                                                         std::chrono::hours validity = std::chrono::hours(24 * 365));
// A new P-256 key and a certificate signing request for it (subject CN `common_name`), both PEM.
struct KeyAndCertificateRequest {
  std::string private_key_pem;
  std::string request_pem;
};
StatusOr<KeyAndCertificateRequest> NewKeyAndCertificateRequest(const std::string& common_name);
// A new self-signed CA (ECDSA P-256 key, CN `common_name`, keyCertSign): the managed workers' own CA
// (cli/managed_workers.h). `identity` is the CN.
StatusOr<IssuedCertificate> CreateCertificateAuthority(const std::string& common_name,
                                                       std::chrono::hours validity = std::chrono::hours(24 * 365 * 10));

}  // namespace parsyn::coordinator
