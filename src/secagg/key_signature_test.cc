// Signed keys under mutual TLS: a worker's advertised keys, signed with its client certificate's key, verify against
// the job's CA, and nothing else does; end to end, a coordinator that swaps a neighbor's key for one of its own is
// caught by the worker and by the coordinator's own check, where without signatures the swap goes unnoticed.
#include "secagg/key_signature.h"

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "secagg/client.h"
#include "secagg/messages.h"
#include "secagg/server.h"

namespace parsyn::secagg {
namespace {

// The value of what must succeed; a failure ends the test binary with its message (a release build has no assert).
template <typename T>
T OkValue(StatusOr<T> value) {
  if (!value.ok()) {
    std::fprintf(stderr, "unexpected failure: %s\n", value.status().ToString().c_str());
    std::abort();
  }
  return *std::move(value);
}

// Ends the test binary when an OpenSSL call of a fixture fails.
void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "test fixture: cannot %s\n", what);
    std::abort();
  }
}

// A certificate and its key, as objects (to issue others with) and as PEM.
struct TestCredential {
  std::shared_ptr<X509> certificate;
  std::shared_ptr<EVP_PKEY> key;
  std::string certificate_pem;
  std::string key_pem;
};

// What a test certificate holds. The defaults are a worker's client certificate as coordinator/auth.cc issues it.
struct CertificateSpec {
  std::string common_name;  // none when empty
  std::string dns_name;     // a subjectAltName DNS entry when not empty
  bool ca = false;
  std::string key_usage = "critical,digitalSignature";
  std::string extended_key_usage = "clientAuth";  // none when empty
  long valid_from_s = -300;                       // from now
  long valid_until_s = 3600;
  std::string key_type = "EC";  // P-256; or "RSA", "ED25519", "X25519"
};

CertificateSpec CaSpec(const std::string& common_name) {
  CertificateSpec spec;
  spec.common_name = common_name;
  spec.ca = true;
  spec.key_usage = "critical,keyCertSign,cRLSign";
  spec.extended_key_usage.clear();
  return spec;
}

CertificateSpec WorkerSpec(uint64_t worker) {
  CertificateSpec spec;
  spec.common_name = "worker-" + std::to_string(worker);
  return spec;
}

EVP_PKEY* GenerateTestKey(const std::string& type) {
  if (type == "EC") return EVP_EC_gen("P-256");
  if (type == "RSA") return EVP_RSA_gen(2048);
  return EVP_PKEY_Q_keygen(nullptr, nullptr, type.c_str());
}

template <typename T, typename Write>
std::string PemOf(T* object, Write write) {
  std::unique_ptr<BIO, decltype(&BIO_free)> out(BIO_new(BIO_s_mem()), BIO_free);
  Require(out != nullptr && write(out.get(), object) == 1, "write PEM");
  char* data = nullptr;
  const long n = BIO_get_mem_data(out.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

void AddTestExtension(X509* certificate, X509V3_CTX* ctx, int nid, const std::string& value) {
  std::unique_ptr<X509_EXTENSION, decltype(&X509_EXTENSION_free)> extension(
      X509V3_EXT_nconf_nid(nullptr, ctx, nid, value.c_str()), X509_EXTENSION_free);
  Require(extension != nullptr && X509_add_ext(certificate, extension.get(), -1) == 1, "add an extension");
}

// A certificate as `spec` says, for a new key, signed by `issuer` (self-signed when null).
TestCredential IssueTestCredential(const CertificateSpec& spec, const TestCredential* issuer) {
  static long serial = 1;
  TestCredential out;
  out.key.reset(GenerateTestKey(spec.key_type), EVP_PKEY_free);
  out.certificate.reset(X509_new(), X509_free);
  Require(out.key && out.certificate, "make a key and a certificate");
  X509* certificate = out.certificate.get();
  X509_set_version(certificate, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(certificate), serial++);
  X509_gmtime_adj(X509_getm_notBefore(certificate), spec.valid_from_s);
  X509_gmtime_adj(X509_getm_notAfter(certificate), spec.valid_until_s);
  X509_NAME* subject = X509_get_subject_name(certificate);
  X509_NAME_add_entry_by_txt(subject, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>("parsyn"), -1, -1, 0);
  if (!spec.common_name.empty()) {
    X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_UTF8,
                               reinterpret_cast<const unsigned char*>(spec.common_name.c_str()), -1, -1, 0);
  }
  X509* signer = issuer != nullptr ? issuer->certificate.get() : certificate;
  EVP_PKEY* signer_key = issuer != nullptr ? issuer->key.get() : out.key.get();
  X509_set_issuer_name(certificate, X509_get_subject_name(signer));
  X509_set_pubkey(certificate, out.key.get());
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, signer, certificate, nullptr, nullptr, 0);
  AddTestExtension(certificate, &ctx, NID_basic_constraints, spec.ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
  AddTestExtension(certificate, &ctx, NID_key_usage, spec.key_usage);
  if (!spec.extended_key_usage.empty()) {
    AddTestExtension(certificate, &ctx, NID_ext_key_usage, spec.extended_key_usage);
  }
  if (!spec.dns_name.empty()) AddTestExtension(certificate, &ctx, NID_subject_alt_name, "DNS:" + spec.dns_name);
  AddTestExtension(certificate, &ctx, NID_subject_key_identifier, "hash");
  if (issuer != nullptr) AddTestExtension(certificate, &ctx, NID_authority_key_identifier, "keyid");
  const int signer_type = EVP_PKEY_get_base_id(signer_key);
  const EVP_MD* digest = signer_type == EVP_PKEY_ED25519 || signer_type == EVP_PKEY_ED448 ? nullptr : EVP_sha256();
  Require(X509_sign(certificate, signer_key, digest) > 0, "sign a certificate");
  out.certificate_pem = PemOf(certificate, PEM_write_bio_X509);
  out.key_pem = PemOf(out.key.get(), [](BIO* bio, EVP_PKEY* key) {
    return PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  });
  return out;
}

// The job's CA and its workers' certificates, and a second CA with the same name that is not the job's.
struct TestPki {
  TestCredential ca;
  TestCredential other_ca;
  std::map<uint64_t, TestCredential> workers;
};

TestPki MakeTestPki() {
  TestPki pki;
  pki.ca = IssueTestCredential(CaSpec("parsyn client CA"), nullptr);
  pki.other_ca = IssueTestCredential(CaSpec("parsyn client CA"), nullptr);
  for (uint64_t worker : {5, 6, 7, 8, 9}) pki.workers[worker] = IssueTestCredential(WorkerSpec(worker), &pki.ca);
  return pki;
}

const TestPki& Pki() {
  static const TestPki pki = MakeTestPki();
  return pki;
}

const std::vector<uint64_t> kSignedWorkers = {5, 6, 7, 8, 9};

RoundSetup SignedSetup(const std::string& attempt) {
  return OkValue(MakeRoundSetup(attempt, kSignedWorkers, 4, 4, 16, 1.0, 20, OkValue(RandomKey())));
}

KeySigner SignerOf(const TestCredential& credential) {
  return OkValue(MakeKeySigner(credential.certificate_pem, credential.key_pem));
}

// The keys `worker` advertises in `setup`, signed with `credential`.
AdvertisedKeys SignedKeysOf(const RoundSetup& setup, uint64_t worker, const TestCredential& credential) {
  return OkValue(Client::Start(setup, worker, SignerOf(credential))).advertised();
}

::testing::AssertionResult IsDenied(const Status& status, const std::string& part) {
  if (status.code() != StatusCode::kPermissionDenied) {
    return ::testing::AssertionFailure() << "not PermissionDenied: " << status.ToString();
  }
  if (status.message().find(part) == std::string::npos) {
    return ::testing::AssertionFailure() << "\"" << status.message() << "\" does not say \"" << part << "\"";
  }
  return ::testing::AssertionSuccess();
}

TEST(KeySignatureTest, KeysSignedWithTheWorkersOwnCertificateVerify) {
  const RoundSetup setup = SignedSetup("job 3 round 2 attempt 1");
  const KeyVerifier verify = OkValue(MakeKeyVerifier(Pki().ca.certificate_pem));
  const AdvertisedKeys keys = SignedKeysOf(setup, 7, Pki().workers.at(7));
  EXPECT_FALSE(keys.signature.empty());
  EXPECT_EQ(keys.certificate, Pki().workers.at(7).certificate_pem);
  EXPECT_TRUE(verify(setup.attempt, keys).ok()) << verify(setup.attempt, keys).ToString();
  const AdvertisedKeys wire = OkValue(ParseAdvertisedKeys(nlohmann::json::parse(ToJson(keys).dump())));
  EXPECT_TRUE(verify(setup.attempt, wire).ok()) << verify(setup.attempt, wire).ToString();
  Server server = OkValue(Server::Start(setup));
  EXPECT_TRUE(server.AddAdvertisedKeys(7, wire, verify).ok());
}

TEST(KeySignatureTest, RsaAndEd25519KeysAndACertificateNamedByItsDnsNameVerifyToo) {
  const RoundSetup setup = SignedSetup("other keys");
  const KeyVerifier verify = OkValue(MakeKeyVerifier(Pki().ca.certificate_pem));
  CertificateSpec rsa = WorkerSpec(7), ed25519 = WorkerSpec(7), dns_only = WorkerSpec(7), both = WorkerSpec(7);
  rsa.key_type = "RSA";
  ed25519.key_type = "ED25519";
  dns_only.common_name.clear();
  dns_only.dns_name = "worker-7";
  both.dns_name = "worker-9.example";  // the CN names the worker
  for (const CertificateSpec& spec : {rsa, ed25519, dns_only, both}) {
    const AdvertisedKeys keys = SignedKeysOf(setup, 7, IssueTestCredential(spec, &Pki().ca));
    const Status status = verify(setup.attempt, keys);
    EXPECT_TRUE(status.ok()) << spec.key_type << " " << spec.common_name << " " << spec.dns_name << ": "
                             << status.ToString();
  }
}

TEST(KeySignatureTest, KeysAlteredOrSignedWithoutTheJobsClientCertificateArePermissionDenied) {
  const RoundSetup setup = SignedSetup("job 3 round 2 attempt 1");
  const KeyVerifier verify = OkValue(MakeKeyVerifier(Pki().ca.certificate_pem));
  const AdvertisedKeys genuine = SignedKeysOf(setup, 7, Pki().workers.at(7));
  const Key32 coordinators = OkValue(GenerateX25519KeyPair()).public_key;
  auto issued = [&](CertificateSpec spec, const TestCredential& issuer) {
    return SignedKeysOf(setup, 7, IssueTestCredential(spec, &issuer));
  };
  CertificateSpec expired = WorkerSpec(7), early = WorkerSpec(7), server = WorkerSpec(7), agreement = WorkerSpec(7);
  CertificateSpec cn_wins = WorkerSpec(9), nameless = WorkerSpec(7);
  expired.valid_from_s = -7200;
  expired.valid_until_s = -3600;
  early.valid_from_s = 3600;
  server.extended_key_usage = "serverAuth";
  agreement.key_usage = "critical,keyAgreement";
  cn_wins.dns_name = "worker-7";
  nameless.common_name.clear();
  struct Case {
    const char* what;
    AdvertisedKeys keys;
    std::string says;
  };
  std::vector<Case> cases = {
      {"the worker field changed", genuine, "the keys of worker 9 are signed by a certificate for 'worker-7'"},
      {"another worker's certificate", SignedKeysOf(setup, 9, Pki().workers.at(7)), "for 'worker-7'"},
      {"a swapped sealing key", genuine, "worker 7 carry a signature that does not verify"},
      {"a swapped masking key", genuine, "worker 7 carry a signature that does not verify"},
      {"a swapped seed commitment", genuine, "worker 7 carry a signature that does not verify"},
      {"a signature for another attempt", genuine, "worker 7 carry a signature that does not verify"},
      {"an altered signature", genuine, "worker 7 carry a signature that does not verify"},
      {"no signature", genuine, "worker 7 carry no signature (every worker must sign its keys under mutual TLS)"},
      {"no certificate", genuine, "worker 7 carry a signature and no certificate"},
      {"a certificate that is not PEM", genuine, "worker 7 carry a certificate that is not PEM X.509"},
      {"another CA of the same name", issued(WorkerSpec(7), Pki().other_ca), "not signed by a valid certificate"},
      {"an expired certificate", issued(expired, Pki().ca), "certificate has expired"},
      {"a certificate not yet valid", issued(early, Pki().ca), "certificate is not yet valid"},
      {"a TLS server certificate", issued(server, Pki().ca), "certificate purpose"},
      {"the CA's own certificate", SignedKeysOf(setup, 7, Pki().ca), "worker 7 are not signed by a valid"},
      {"a keyAgreement-only certificate", issued(agreement, Pki().ca), "keyUsage lacks digitalSignature"},
      {"a CN for another worker", issued(cn_wins, Pki().ca), "for 'worker-9', not 'worker-7'"},
      {"a certificate without a name", issued(nameless, Pki().ca), "for no usable name"},
  };
  cases[0].keys.worker = 9;
  cases[2].keys.sealing_key = coordinators;
  cases[3].keys.masking_key = coordinators;
  cases[4].keys.seed_commitment = coordinators;
  cases[5].keys.signature = OkValue(SignerOf(Pki().workers.at(7)).sign(SignedBytes("another attempt", genuine)));
  cases[6].keys.signature.back() ^= 1;
  cases[7].keys.signature.clear();
  cases[7].keys.certificate.clear();
  cases[8].keys.certificate.clear();
  cases[9].keys.certificate = "worker-7";
  for (const Case& c : cases) EXPECT_TRUE(IsDenied(verify(setup.attempt, c.keys), c.says)) << c.what;
  EXPECT_TRUE(verify(setup.attempt, genuine).ok());
}

TEST(KeySignatureTest, MakeKeySignerRefusesAKeyThatIsNotTheCertificates) {
  const TestCredential& seven = Pki().workers.at(7);
  const Status other_key = MakeKeySigner(seven.certificate_pem, Pki().workers.at(9).key_pem).status();
  EXPECT_EQ(other_key.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other_key.message().find("not the key of its certificate"), std::string::npos) << other_key.ToString();
  EXPECT_EQ(MakeKeySigner(seven.key_pem, seven.key_pem).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeKeySigner(seven.certificate_pem, seven.certificate_pem).status().code(), StatusCode::kInvalidArgument);
  CertificateSpec x25519 = WorkerSpec(7);
  x25519.key_type = "X25519";
  const TestCredential agreement_only = IssueTestCredential(x25519, &Pki().ca);
  const Status cannot_sign = MakeKeySigner(agreement_only.certificate_pem, agreement_only.key_pem).status();
  EXPECT_EQ(cannot_sign.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cannot_sign.message().find("does not sign"), std::string::npos) << cannot_sign.ToString();
  EXPECT_EQ(MakeKeyVerifier(seven.key_pem).status().code(), StatusCode::kInvalidArgument);
}

TEST(KeySignatureTest, TheSignerSendsTheCertificateAloneFromAPemThatAlsoHoldsTheKey) {
  const TestCredential& seven = Pki().workers.at(7);
  const KeySigner signer = OkValue(MakeKeySigner(seven.certificate_pem + seven.key_pem, seven.key_pem));
  EXPECT_EQ(signer.certificate_pem, seven.certificate_pem);
  EXPECT_EQ(signer.certificate_pem.find("PRIVATE KEY"), std::string::npos);
}

// What each worker's ShareKeys returns when a coordinator, between Server::KeysFor and the worker, puts a key it made
// in place of one neighbor's masking key in what it forwards to the first worker. Under mutual TLS every worker signs
// its keys and checks its neighbors'; without, no one signs or checks (the honest-but-curious model).
struct SwapOutcome {
  uint64_t victim = 0;
  uint64_t swapped = 0;
  std::map<uint64_t, Status> share_keys;
};

SwapOutcome ShareKeysAfterASwap(bool mutual_tls) {
  const RoundSetup setup = SignedSetup(mutual_tls ? "swap under mutual TLS" : "swap without TLS");
  const KeyVerifier verify = mutual_tls ? OkValue(MakeKeyVerifier(Pki().ca.certificate_pem)) : KeyVerifier();
  Server server = OkValue(Server::Start(setup));
  std::map<uint64_t, Client> clients;
  for (uint64_t id : setup.participants) {
    const KeySigner signer = mutual_tls ? SignerOf(Pki().workers.at(id)) : KeySigner{};
    clients.emplace(id, OkValue(Client::Start(setup, id, signer)));
    Require(server.AddAdvertisedKeys(id, clients.at(id).advertised(), verify).ok(), "advertise genuine keys");
  }
  Require(server.EndAdvertising().ok(), "end advertising");
  SwapOutcome outcome;
  outcome.victim = setup.participants.front();
  for (auto& [id, client] : clients) {
    std::vector<AdvertisedKeys> forwarded = server.KeysFor(id);
    Require(!forwarded.empty(), "forward neighbors' keys");
    if (id == outcome.victim) {
      // A key the coordinator made: it holds the private half.
      forwarded.back().masking_key = OkValue(GenerateX25519KeyPair()).public_key;
      outcome.swapped = forwarded.back().worker;
    }
    outcome.share_keys[id] = client.ShareKeys(forwarded, verify).status();
  }
  return outcome;
}

TEST(KeySignatureTest, UnderMutualTlsAWorkerRefusesANeighborsKeySwappedByTheCoordinator) {
  const SwapOutcome outcome = ShareKeysAfterASwap(true);
  for (const auto& [id, status] : outcome.share_keys) {
    if (id == outcome.victim) {
      EXPECT_TRUE(IsDenied(
          status, "the keys of worker " + std::to_string(outcome.swapped) + " carry a signature that does not verify"));
    } else {
      EXPECT_TRUE(status.ok()) << "worker " << id << ": " << status.ToString();
    }
  }
}

TEST(KeySignatureTest, WithoutSignaturesTheSameSwapGoesUnnoticedHonestButCuriousOnly) {
  const SwapOutcome outcome = ShareKeysAfterASwap(false);
  for (const auto& [id, status] : outcome.share_keys) EXPECT_TRUE(status.ok()) << id << ": " << status.ToString();
}

TEST(KeySignatureTest, TheCoordinatorsOwnCheckRefusesASwappedKeyAndThenTakesTheGenuineOnes) {
  const RoundSetup setup = SignedSetup("server check");
  const KeyVerifier verify = OkValue(MakeKeyVerifier(Pki().ca.certificate_pem));
  Server server = OkValue(Server::Start(setup));
  const AdvertisedKeys genuine = SignedKeysOf(setup, 7, Pki().workers.at(7));
  AdvertisedKeys swapped = genuine;
  swapped.masking_key = OkValue(GenerateX25519KeyPair()).public_key;
  EXPECT_TRUE(
      IsDenied(server.AddAdvertisedKeys(7, swapped, verify), "worker 7 carry a signature that does not verify"));
  EXPECT_TRUE(server.AddAdvertisedKeys(7, genuine, verify).ok());
}

}  // namespace
}  // namespace parsyn::secagg
