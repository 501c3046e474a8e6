// Mutual TLS credentials of auth.h: the certificate check every worker route and bound blob URL goes through, and
// worker certificates issued from an operator's CA, checked with OpenSSL's own verifier.
#include "coordinator/auth.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <memory>
#include <vector>

#include "base/testing/temp_dir.h"

namespace parsyn::coordinator {
namespace {

namespace fs = std::filesystem;

void WriteText(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::unique_ptr<X509, decltype(&X509_free)> ParseCertificate(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  return {PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), X509_free};
}

std::string CommonName(X509* cert) {
  char cn[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn));
  return cn;
}

storage::Worker WorkerWithToken(int64_t id, std::string_view token, bool revoked = false) {
  storage::Worker w;
  w.id = id;
  w.token_sha256 = HashSecret(token);
  w.revoked = revoked;
  return w;
}

TEST(WorkerTokensTest, FindsWorkersByTokenAndRevocationsByWorker) {
  WorkerTokens tokens;
  tokens.Reset(std::vector{WorkerWithToken(1, "pwt_one"), WorkerWithToken(2, "pwt_two", /*revoked=*/true)});
  tokens.Add(WorkerWithToken(3, "pwt_three"));

  const WorkerTokens::Entry* one = tokens.Find(HashSecret("pwt_one"));
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(one->worker_id, 1);
  EXPECT_FALSE(one->revoked);
  EXPECT_EQ(tokens.Find(HashSecret("pwt_three"))->worker_id, 3);
  EXPECT_EQ(tokens.Find(HashSecret("pwt_unknown")), nullptr);
  EXPECT_FALSE(tokens.Revoked(1));
  EXPECT_TRUE(tokens.Revoked(2));
  EXPECT_FALSE(tokens.Revoked(3));
  EXPECT_TRUE(tokens.Revoked(99)) << "an id no token belongs to counts as revoked";

  tokens.Revoke(3);
  EXPECT_TRUE(tokens.Revoked(3));
  EXPECT_TRUE(tokens.Find(HashSecret("pwt_three"))->revoked) << "the token stops authenticating too";
  EXPECT_FALSE(tokens.Revoked(1));
  tokens.Revoke(99);  // unknown: nothing to change
  EXPECT_EQ(tokens.Find(HashSecret("pwt_unknown")), nullptr);

  tokens.Reset(std::vector{WorkerWithToken(1, "pwt_one")});
  EXPECT_EQ(tokens.Find(HashSecret("pwt_three")), nullptr) << "Reset drops what the store no longer has";
  EXPECT_TRUE(tokens.Revoked(3));
}

TEST(WorkerCertificateTest, CheckWantsTheTokensOwnWorker) {
  EXPECT_EQ(WorkerCertificateIdentity(7), "worker-7");
  EXPECT_TRUE(CheckWorkerCertificate("worker-7", 7).ok());

  Status missing = CheckWorkerCertificate(std::nullopt, 7);
  EXPECT_EQ(missing.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(missing.message().find("requires a client certificate"), std::string::npos) << missing.message();
  EXPECT_NE(missing.message().find("'worker-7'"), std::string::npos) << missing.message();

  for (const char* other : {"worker-8", "worker-70", "worker-7 ", "Worker-7", ""}) {
    Status wrong = CheckWorkerCertificate(std::string(other), 7);
    EXPECT_EQ(wrong.code(), StatusCode::kPermissionDenied) << other;
  }
  EXPECT_NE(CheckWorkerCertificate("worker-8", 7)
                .message()
                .find("is for 'worker-8', but this token belongs to "
                      "'worker-7'"),
            std::string::npos);
}

TEST(WorkerCertificateTest, IssuedCertificateVerifiesAgainstTheCaAndNamesTheWorker) {
  test_support::TempDir dir("parsyn-auth-test");
  StatusOr<IssuedCertificate> ca = CreateCertificateAuthority("test CA");
  ASSERT_TRUE(ca.ok()) << ca.status().ToString();
  WriteText(dir.path() / "ca.pem", ca->certificate_pem);
  WriteText(dir.path() / "ca.key", ca->private_key_pem);

  StatusOr<IssuedCertificate> issued =
      IssueWorkerCertificate(dir.path() / "ca.pem", dir.path() / "ca.key", 42, std::chrono::hours(24 * 365));
  ASSERT_TRUE(issued.ok()) << issued.status().ToString();
  EXPECT_EQ(issued->identity, "worker-42");
  EXPECT_NE(issued->private_key_pem.find("BEGIN PRIVATE KEY"), std::string::npos);
  auto cert = ParseCertificate(issued->certificate_pem);
  ASSERT_NE(cert, nullptr);
  EXPECT_EQ(CommonName(cert.get()), "worker-42");
  // For clients only, not a CA.
  EXPECT_EQ(X509_check_ca(cert.get()), 0);
  EXPECT_EQ(X509_check_purpose(cert.get(), X509_PURPOSE_SSL_CLIENT, 0), 1);
  EXPECT_EQ(X509_check_purpose(cert.get(), X509_PURPOSE_SSL_SERVER, 0), 0);
  // About a year.
  const time_t now = std::time(nullptr);
  time_t in_364_days = now + 364 * 86400, in_366_days = now + 366 * 86400;
  EXPECT_EQ(X509_cmp_time(X509_get0_notAfter(cert.get()), &in_364_days), 1);
  EXPECT_EQ(X509_cmp_time(X509_get0_notAfter(cert.get()), &in_366_days), -1);

  // OpenSSL's verifier accepts the chain, as the server's handshake does.
  auto ca_cert = ParseCertificate(ca->certificate_pem);
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), X509_STORE_free);
  X509_STORE_add_cert(store.get(), ca_cert.get());
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(X509_STORE_CTX_new(), X509_STORE_CTX_free);
  ASSERT_EQ(X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr), 1);
  X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_CLIENT);
  EXPECT_EQ(X509_verify_cert(ctx.get()), 1) << X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));

  // Two issues are two keys and two serials.
  StatusOr<IssuedCertificate> again = IssueWorkerCertificate(dir.path() / "ca.pem", dir.path() / "ca.key", 42);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->private_key_pem, issued->private_key_pem);
  auto again_cert = ParseCertificate(again->certificate_pem);
  EXPECT_NE(ASN1_INTEGER_cmp(X509_get0_serialNumber(cert.get()), X509_get0_serialNumber(again_cert.get())), 0);
}

TEST(WorkerCertificateTest, IssuingRefusesAWrongCaNamingTheFile) {
  test_support::TempDir dir("parsyn-auth-test");
  StatusOr<IssuedCertificate> ca = CreateCertificateAuthority("test CA");
  StatusOr<IssuedCertificate> other = CreateCertificateAuthority("other CA");
  ASSERT_TRUE(ca.ok() && other.ok());
  WriteText(dir.path() / "ca.pem", ca->certificate_pem);
  WriteText(dir.path() / "ca.key", ca->private_key_pem);
  WriteText(dir.path() / "other.key", other->private_key_pem);
  StatusOr<IssuedCertificate> leaf = IssueWorkerCertificate(dir.path() / "ca.pem", dir.path() / "ca.key", 1);
  ASSERT_TRUE(leaf.ok());
  WriteText(dir.path() / "leaf.pem", leaf->certificate_pem);
  WriteText(dir.path() / "leaf.key", leaf->private_key_pem);

  auto expect_refused = [&](const fs::path& cert, const fs::path& key, const std::string& words) {
    StatusOr<IssuedCertificate> r = IssueWorkerCertificate(cert, key, 3);
    ASSERT_FALSE(r.ok()) << cert << " " << key;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
  };
  expect_refused(dir.path() / "missing.pem", dir.path() / "ca.key", "missing.pem: cannot open it");
  expect_refused(dir.path() / "ca.key", dir.path() / "ca.key", "not a PEM certificate");
  expect_refused(dir.path() / "leaf.pem", dir.path() / "leaf.key", "leaf.pem: not a CA certificate");
  expect_refused(dir.path() / "ca.pem", dir.path() / "ca.pem", "not an unencrypted PEM private key");
  expect_refused(dir.path() / "ca.pem", dir.path() / "other.key", "other.key does not belong to");
}

}  // namespace
}  // namespace parsyn::coordinator
