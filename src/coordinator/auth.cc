#include "coordinator/auth.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "base/secure_random.h"
#include "base/sha256.h"
#include "base/strings.h"
#include "base/text_file.h"

namespace parsyn::coordinator {

namespace {

template <typename T, void (*Free)(T*)>
struct OpenSslDeleter {
  void operator()(T* p) const { Free(p); }
};
using X509Ptr = std::unique_ptr<X509, OpenSslDeleter<X509, X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, OpenSslDeleter<EVP_PKEY, EVP_PKEY_free>>;
using BioPtr = std::unique_ptr<BIO, OpenSslDeleter<BIO, BIO_free_all>>;
using RequestPtr = std::unique_ptr<X509_REQ, OpenSslDeleter<X509_REQ, X509_REQ_free>>;
using ExtensionPtr = std::unique_ptr<X509_EXTENSION, OpenSslDeleter<X509_EXTENSION, X509_EXTENSION_free>>;

// OpenSSL's most recent error as text (and clears its queue), for messages.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

StatusOr<std::string> BioContents(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  if (n < 0) return InternalError("cannot read an OpenSSL memory buffer");
  return std::string(data, static_cast<size_t>(n));
}

Status AddExtension(X509* cert, X509V3_CTX* ctx, int nid, const char* value) {
  ExtensionPtr extension(X509V3_EXT_nconf_nid(nullptr, ctx, nid, value));
  if (!extension || X509_add_ext(cert, extension.get(), -1) != 1) {
    return InternalError(std::string("cannot add the ") + OBJ_nid2sn(nid) + " extension: " + OpenSslError());
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> NewSecret(std::string_view prefix) {
  PARSYN_ASSIGN_OR_RETURN(std::string hex, SecureRandomHex(32));
  return std::string(prefix) + hex;
}

std::string HashSecret(std::string_view secret) { return Sha256Hex(secret); }

StatusOr<AdminKeySetup> EnsureAdminKey(storage::MetadataStore& store, const std::filesystem::path& data_dir) {
  AdminKeySetup setup;
  StatusOr<std::string> existing = store.GetAdminKeyHash();
  if (existing.ok()) return setup;
  if (existing.status().code() != StatusCode::kNotFound) return existing.status();
  PARSYN_ASSIGN_OR_RETURN(std::string key, NewSecret("psk_"));
  const std::filesystem::path key_file = data_dir / "admin-key";
  // A key file without a stored hash is left from a start that crashed in between: replace it.
  std::error_code ec;
  std::filesystem::remove(key_file, ec);
  PARSYN_RETURN_IF_ERROR(WriteNewSecretFile(key_file, key + "\n"));
  PARSYN_RETURN_IF_ERROR(store.SetAdminKeyHash(HashSecret(key)));
  setup.new_key = key;
  return setup;
}

StatusOr<std::string> ReadOperatorKeyFile(const std::filesystem::path& file, std::string_view flag) {
  StatusOr<std::string> key = ReadTrimmedTextFile(file);
  if (!key.ok()) return InvalidArgumentError(std::string(flag) + ": " + key.status().message());
  constexpr size_t kMinLength = 32;  // 128 bits as hex: a guess is hopeless
  if (key->size() < kMinLength) {
    return InvalidArgumentError(std::string(flag) + ": the key in " + file.string() + " is " +
                                std::to_string(key->size()) + " characters; use at least " +
                                std::to_string(kMinLength) + " (e.g. `openssl rand -hex 32`)");
  }
  return key;
}

Status UseAdminKeyFile(storage::MetadataStore& store, const std::filesystem::path& file) {
  PARSYN_ASSIGN_OR_RETURN(const std::string key, ReadOperatorKeyFile(file, "--admin-key-file"));
  const std::string hash = HashSecret(key);
  StatusOr<std::string> stored = store.GetAdminKeyHash();
  if (stored.ok() && *stored == hash) return Status::Ok();
  if (!stored.ok() && stored.status().code() != StatusCode::kNotFound) return stored.status();
  return store.SetAdminKeyHash(hash);
}

StatusOr<std::string> LoadOrCreateSigningSecret(const std::filesystem::path& data_dir) {
  const std::filesystem::path path = data_dir / "url-signing-secret";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    PARSYN_ASSIGN_OR_RETURN(std::string secret, NewSecret(""));
    Status written = WriteNewSecretFile(path, secret + "\n");
    if (!written.ok() && written.code() != StatusCode::kAlreadyExists) return written;
  }
  PARSYN_ASSIGN_OR_RETURN(std::string secret, ReadTrimmedTextFile(path));
  if (secret.size() < 32) return DataLossError(path.string() + " is truncated; delete it to make a new one");
  return secret;
}

StatusOr<std::string> BearerToken(std::string_view header) {
  if (header.empty()) return UnauthenticatedError("missing Authorization header (expected \"Bearer <key>\")");
  constexpr std::string_view kScheme = "Bearer ";
  if (header.size() <= kScheme.size() || header.substr(0, kScheme.size()) != kScheme) {
    return UnauthenticatedError("Authorization header is not a bearer credential (expected \"Bearer <key>\")");
  }
  std::string_view token = header.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  if (token.empty()) return UnauthenticatedError("empty bearer token");
  return std::string(token);
}

bool DigestsEqual(std::string_view a, std::string_view b) {
  // OpenSSL's constant-time compare: a hand-written loop may be turned into an early-exit compare by the optimizer.
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void WorkerTokens::Reset(std::span<const storage::Worker> workers) {
  worker_by_token_sha256_.clear();
  by_worker_.clear();
  for (const storage::Worker& w : workers) Add(w);
}

void WorkerTokens::Add(const storage::Worker& worker) {
  worker_by_token_sha256_[worker.token_sha256] = worker.id;
  by_worker_[worker.id] = Entry{
      .worker_id = worker.id,
      .revoked = worker.revoked,
      .project_id = worker.kind == storage::WorkerKind::kManaged ? std::nullopt : std::optional(worker.project_id)};
}

bool WorkerTokens::ServesProject(int64_t worker_id, int64_t project_id) const {
  auto it = by_worker_.find(worker_id);
  return it != by_worker_.end() && (!it->second.project_id || *it->second.project_id == project_id);
}

int64_t WorkerTokens::FeedProject(int64_t worker_id) const {
  auto it = by_worker_.find(worker_id);
  return it == by_worker_.end() ? 0 : it->second.project_id.value_or(0);
}

void WorkerTokens::Revoke(int64_t worker_id) {
  if (auto it = by_worker_.find(worker_id); it != by_worker_.end()) it->second.revoked = true;
}

const WorkerTokens::Entry* WorkerTokens::Find(std::string_view token_sha256) const {
  auto token = worker_by_token_sha256_.find(token_sha256);
  if (token == worker_by_token_sha256_.end()) return nullptr;
  auto it = by_worker_.find(token->second);
  return it == by_worker_.end() ? nullptr : &it->second;
}

bool WorkerTokens::Revoked(int64_t worker_id) const {
  auto it = by_worker_.find(worker_id);
  return it == by_worker_.end() || it->second.revoked;
}

std::string WorkerCertificateIdentity(int64_t worker_id) { return "worker-" + std::to_string(worker_id); }

Status CheckWorkerCertificate(const std::optional<std::string>& client_identity, int64_t worker_id) {
  const std::string expected = WorkerCertificateIdentity(worker_id);
  if (!client_identity) {
    return UnauthenticatedError(
        "this coordinator requires a client certificate from workers (mutual TLS): start the worker with --cert and "
        "--key, a certificate for '" +
        expected + "' signed by the coordinator's client CA (`parsyn worker register --ca-cert --ca-key` issues one)");
  }
  if (*client_identity != expected) {
    return PermissionDeniedError("the client certificate is for '" + *client_identity +
                                 "', but this token belongs to '" + expected +
                                 "': each worker presents its own certificate");
  }
  return Status::Ok();
}

namespace {

// A certificate with subject "O=parsyn, CN=<common_name>" for `subject_key`, or for a new P-256 key when it is null
// (then returned in private_key_pem), valid from a few minutes ago (a peer whose clock is slightly behind accepts it
// at once) for `validity`. Signed by `issuer`/`issuer_key`, or self-signed when `issuer` is null. `ca`: a CA
// certificate (keyCertSign) rather than a client certificate.
StatusOr<IssuedCertificate> MakeCertificate(const std::string& common_name, X509* issuer, EVP_PKEY* issuer_key, bool ca,
                                            std::chrono::hours validity, EVP_PKEY* subject_key = nullptr) {
  KeyPtr generated;
  if (subject_key == nullptr) {
    generated.reset(EVP_EC_gen("P-256"));
    if (!generated) return InternalError("cannot generate a P-256 key: " + OpenSslError());
    subject_key = generated.get();
  }
  if (issuer_key == nullptr) issuer_key = subject_key;

  X509Ptr cert(X509_new());
  if (!cert) return InternalError("cannot allocate a certificate: " + OpenSslError());
  X509_set_version(cert.get(), 2);  // v3
  // A random positive 125-bit serial, as RFC 5280 asks (unique per CA without keeping a counter).
  PARSYN_ASSIGN_OR_RETURN(std::string serial_hex, NewSecret(""));
  serial_hex = "1" + serial_hex.substr(0, 31);
  BIGNUM* serial_bn = nullptr;
  const bool serial_set = BN_hex2bn(&serial_bn, serial_hex.c_str()) != 0 &&
                          BN_to_ASN1_INTEGER(serial_bn, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(serial_bn);
  if (!serial_set) return InternalError("cannot set the serial number: " + OpenSslError());
  const int64_t validity_s = std::chrono::duration_cast<std::chrono::seconds>(validity).count();
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -5 * 60);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), validity_s);
  X509_NAME* subject = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(subject, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>("parsyn"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(common_name.c_str()),
                             -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer != nullptr ? X509_get_subject_name(issuer) : subject);
  X509_set_pubkey(cert.get(), subject_key);

  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : cert.get(), cert.get(), nullptr, nullptr, 0);
  PARSYN_RETURN_IF_ERROR(
      AddExtension(cert.get(), &ctx, NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE"));
  PARSYN_RETURN_IF_ERROR(
      AddExtension(cert.get(), &ctx, NID_key_usage, ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature"));
  if (!ca) PARSYN_RETURN_IF_ERROR(AddExtension(cert.get(), &ctx, NID_ext_key_usage, "clientAuth"));
  PARSYN_RETURN_IF_ERROR(AddExtension(cert.get(), &ctx, NID_subject_key_identifier, "hash"));
  if (issuer != nullptr) PARSYN_RETURN_IF_ERROR(AddExtension(cert.get(), &ctx, NID_authority_key_identifier, "keyid"));

  // Ed25519/Ed448 keys sign without a separate digest.
  const int key_type = EVP_PKEY_get_base_id(issuer_key);
  const EVP_MD* digest = key_type == EVP_PKEY_ED25519 || key_type == EVP_PKEY_ED448 ? nullptr : EVP_sha256();
  if (X509_sign(cert.get(), issuer_key, digest) <= 0) {
    return InvalidArgumentError("cannot sign the certificate: " + OpenSslError());
  }

  IssuedCertificate issued;
  issued.identity = common_name;
  issued.not_after_unix_s =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count() +
      validity_s;
  BioPtr cert_out(BIO_new(BIO_s_mem()));
  BioPtr key_out(BIO_new(BIO_s_mem()));
  if (!cert_out || !key_out || PEM_write_bio_X509(cert_out.get(), cert.get()) != 1 ||
      (generated &&
       PEM_write_bio_PrivateKey(key_out.get(), generated.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)) {
    return InternalError("cannot write the certificate as PEM: " + OpenSslError());
  }
  PARSYN_ASSIGN_OR_RETURN(issued.certificate_pem, BioContents(cert_out.get()));
  if (generated) {
    PARSYN_ASSIGN_OR_RETURN(issued.private_key_pem, BioContents(key_out.get()));
  }
  return issued;
}

struct CertificateAuthority {
  X509Ptr certificate;
  KeyPtr key;
};

// The CA in ca_cert_file (PEM) and ca_key_file (unencrypted PEM), checked to be a CA and its key.
StatusOr<CertificateAuthority> LoadCertificateAuthority(const std::filesystem::path& ca_cert_file,
                                                        const std::filesystem::path& ca_key_file) {
  ERR_clear_error();
  BioPtr cert_in(BIO_new_file(ca_cert_file.c_str(), "r"));
  if (!cert_in) return InvalidArgumentError("CA certificate " + ca_cert_file.string() + ": cannot open it");
  X509Ptr ca(PEM_read_bio_X509(cert_in.get(), nullptr, nullptr, nullptr));
  if (!ca) {
    return InvalidArgumentError("CA certificate " + ca_cert_file.string() + ": not a PEM certificate (" +
                                OpenSslError() + ")");
  }
  if (X509_check_ca(ca.get()) == 0) {
    return InvalidArgumentError("CA certificate " + ca_cert_file.string() +
                                ": not a CA certificate (it lacks basicConstraints CA:TRUE or keyCertSign)");
  }
  BioPtr key_in(BIO_new_file(ca_key_file.c_str(), "r"));
  if (!key_in) return InvalidArgumentError("CA key " + ca_key_file.string() + ": cannot open it");
  KeyPtr ca_key(PEM_read_bio_PrivateKey(key_in.get(), nullptr, nullptr, nullptr));
  if (!ca_key) {
    return InvalidArgumentError("CA key " + ca_key_file.string() + ": not an unencrypted PEM private key (" +
                                OpenSslError() + ")");
  }
  if (X509_check_private_key(ca.get(), ca_key.get()) != 1) {
    ERR_clear_error();
    return InvalidArgumentError("CA key " + ca_key_file.string() + " does not belong to " + ca_cert_file.string());
  }
  return CertificateAuthority{.certificate = std::move(ca), .key = std::move(ca_key)};
}

}  // namespace

StatusOr<IssuedCertificate> IssueWorkerCertificate(const std::filesystem::path& ca_cert_file,
                                                   const std::filesystem::path& ca_key_file, int64_t worker_id,
                                                   std::chrono::hours validity) {
  PARSYN_ASSIGN_OR_RETURN(CertificateAuthority ca, LoadCertificateAuthority(ca_cert_file, ca_key_file));
  return MakeCertificate(WorkerCertificateIdentity(worker_id), ca.certificate.get(), ca.key.get(), false, validity);
}

StatusOr<IssuedCertificate> SignWorkerCertificateRequest(const std::filesystem::path& ca_cert_file,
                                                         const std::filesystem::path& ca_key_file,
                                                         std::string_view request_pem, int64_t worker_id,
                                                         std::chrono::hours validity) {
  ERR_clear_error();
  BioPtr in(BIO_new_mem_buf(request_pem.data(), static_cast<int>(request_pem.size())));
  RequestPtr request(in ? PEM_read_bio_X509_REQ(in.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!request) {
    ERR_clear_error();
    return InvalidArgumentError("csr is not a PEM certificate signing request (-----BEGIN CERTIFICATE REQUEST-----)");
  }
  EVP_PKEY* public_key = X509_REQ_get0_pubkey(request.get());
  if (public_key == nullptr || X509_REQ_verify(request.get(), public_key) != 1) {
    ERR_clear_error();
    return InvalidArgumentError("csr's signature does not verify with its own public key");
  }
  PARSYN_ASSIGN_OR_RETURN(CertificateAuthority ca, LoadCertificateAuthority(ca_cert_file, ca_key_file));
  return MakeCertificate(WorkerCertificateIdentity(worker_id), ca.certificate.get(), ca.key.get(), false, validity,
                         public_key);
}

StatusOr<KeyAndCertificateRequest> NewKeyAndCertificateRequest(const std::string& common_name) {
  ERR_clear_error();
  KeyPtr key(EVP_EC_gen("P-256"));
  RequestPtr request(X509_REQ_new());
  if (!key || !request) return InternalError("cannot make a key and a certificate request: " + OpenSslError());
  X509_NAME* subject = X509_REQ_get_subject_name(request.get());
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(common_name.c_str()),
                             -1, -1, 0);
  if (X509_REQ_set_pubkey(request.get(), key.get()) != 1 ||
      X509_REQ_sign(request.get(), key.get(), EVP_sha256()) <= 0) {
    return InternalError("cannot sign the certificate request: " + OpenSslError());
  }
  BioPtr request_out(BIO_new(BIO_s_mem()));
  BioPtr key_out(BIO_new(BIO_s_mem()));
  if (!request_out || !key_out || PEM_write_bio_X509_REQ(request_out.get(), request.get()) != 1 ||
      PEM_write_bio_PrivateKey(key_out.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return InternalError("cannot write the certificate request as PEM: " + OpenSslError());
  }
  KeyAndCertificateRequest out;
  PARSYN_ASSIGN_OR_RETURN(out.request_pem, BioContents(request_out.get()));
  PARSYN_ASSIGN_OR_RETURN(out.private_key_pem, BioContents(key_out.get()));
  return out;
}

StatusOr<IssuedCertificate> CreateCertificateAuthority(const std::string& common_name, std::chrono::hours validity) {
  ERR_clear_error();
  return MakeCertificate(common_name, nullptr, nullptr, true, validity);
}

}  // namespace parsyn::coordinator
