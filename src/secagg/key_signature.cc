#include "secagg/key_signature.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "secagg/messages.h"

namespace parsyn::secagg {
namespace {

// Hands an OpenSSL object to its free function (a unique_ptr's or a shared_ptr's deleter).
template <auto Free>
struct FreeWith {
  template <typename T>
  void operator()(T* object) const {
    Free(object);
  }
};
using BioPtr = std::unique_ptr<BIO, FreeWith<BIO_free>>;
using CertificatePtr = std::unique_ptr<X509, FreeWith<X509_free>>;
using PrivateKeyPtr = std::unique_ptr<EVP_PKEY, FreeWith<EVP_PKEY_free>>;
using DigestContextPtr = std::unique_ptr<EVP_MD_CTX, FreeWith<EVP_MD_CTX_free>>;
using StoreContextPtr = std::unique_ptr<X509_STORE_CTX, FreeWith<X509_STORE_CTX_free>>;
using GeneralNamesPtr = std::unique_ptr<GENERAL_NAMES, FreeWith<GENERAL_NAMES_free>>;

// The first error OpenSSL queued on this thread, with the queue emptied: a stale error would otherwise be read as
// the cause of a later call's failure.
std::string TakeOpenSslError() {
  const unsigned long code = ERR_peek_error();
  char text[256] = "no error queued";
  if (code != 0) ERR_error_string_n(code, text, sizeof text);
  ERR_clear_error();
  return text;
}

// A read-only memory BIO over `text` (which must outlive it); null if it cannot be made.
BioPtr ReadOnlyBio(const std::string& text) {
  if (text.size() > static_cast<size_t>(INT_MAX)) return nullptr;
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// The first PEM certificate in `pem`; null if there is none.
CertificatePtr ReadCertificate(const std::string& pem) {
  BioPtr in = ReadOnlyBio(pem);
  CertificatePtr certificate(in ? PEM_read_bio_X509(in.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!certificate) ERR_clear_error();
  return certificate;
}

// A passphrase callback that gives none: OpenSSL's default one would prompt on the terminal for an encrypted key.
int NoPassphrase(char*, int, int, void*) { return 0; }

bool CanSign(EVP_PKEY* key) {
  switch (EVP_PKEY_get_base_id(key)) {
    case EVP_PKEY_EC:
    case EVP_PKEY_RSA:
    case EVP_PKEY_ED25519:
    case EVP_PKEY_ED448: return true;
    default: return false;
  }
}

// The digest a key signs with: none for Ed25519/Ed448 (their signature hashes the message itself), else SHA-256.
const EVP_MD* SignatureDigest(EVP_PKEY* key) {
  const int type = EVP_PKEY_get_base_id(key);
  return type == EVP_PKEY_ED25519 || type == EVP_PKEY_ED448 ? nullptr : EVP_sha256();
}

StatusOr<std::string> Sign(EVP_PKEY* key, std::string_view bytes) {
  DigestContextPtr ctx(EVP_MD_CTX_new());
  std::string signature(static_cast<size_t>(std::max(EVP_PKEY_get_size(key), 0)), '\0');
  size_t length = signature.size();
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, SignatureDigest(key), nullptr, key) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &length,
                     reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()) != 1) {
    return InternalError("cannot sign the advertised keys: " + TakeOpenSslError());
  }
  signature.resize(length);
  return signature;
}

bool SignatureVerifies(EVP_PKEY* key, std::string_view bytes, std::string_view signature) {
  DigestContextPtr ctx(EVP_MD_CTX_new());
  const bool verifies =
      ctx && key != nullptr && EVP_DigestVerifyInit(ctx.get(), nullptr, SignatureDigest(key), nullptr, key) == 1 &&
      EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                       reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()) == 1;
  ERR_clear_error();
  return verifies;
}

// An ASN.1 string as UTF-8; none when it is empty or holds a NUL, which could make "worker-1\0..." pass for
// "worker-1" in a C string comparison.
std::optional<std::string> Utf8Text(const ASN1_STRING* value) {
  unsigned char* utf8 = nullptr;
  const int length = ASN1_STRING_to_UTF8(&utf8, value);
  if (length < 0) {
    ERR_clear_error();
    return std::nullopt;
  }
  std::string text(reinterpret_cast<char*>(utf8), static_cast<size_t>(length));
  OPENSSL_free(utf8);
  if (text.empty() || text.find('\0') != std::string::npos) return std::nullopt;
  return text;
}

// Whom a certificate names, by the coordinator's rule for a mutual-TLS client (http's VerifiedPeerIdentity): its
// subject CN, or its first DNS subjectAltName when it has no CN. None when the name it has is unusable.
std::optional<std::string> CertificateIdentity(X509* certificate) {
  X509_NAME* subject = X509_get_subject_name(certificate);
  if (const int index = X509_NAME_get_index_by_NID(subject, NID_commonName, -1); index >= 0) {
    return Utf8Text(X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index)));
  }
  GeneralNamesPtr names(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(certificate, NID_subject_alt_name, nullptr, nullptr)));
  for (int i = 0; names && i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    if (name->type == GEN_DNS) return Utf8Text(name->d.dNSName);
  }
  return std::nullopt;
}

// That `certificate` chains to a CA in `store` now and may serve as a TLS client certificate that signs.
// `keys_of` names whose keys it came with ("the keys of worker 7").
Status CheckChain(X509_STORE* store, X509* certificate, const std::string& keys_of) {
  StoreContextPtr ctx(X509_STORE_CTX_new());
  if (!ctx || X509_STORE_CTX_init(ctx.get(), store, certificate, nullptr) != 1 ||
      X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_CLIENT) != 1) {
    return InternalError("cannot check the certificate of " + keys_of + ": " + TakeOpenSslError());
  }
  if (X509_verify_cert(ctx.get()) != 1) {
    const int error = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return PermissionDeniedError(
        keys_of + " are not signed by a valid certificate of the job's CA: " + X509_verify_cert_error_string(error));
  }
  // X509_PURPOSE_SSL_CLIENT lets a keyUsage of keyAgreement alone pass; these keys are signed. A certificate without
  // the extension gives every bit (RFC 5280: no restriction).
  if ((X509_get_key_usage(certificate) & KU_DIGITAL_SIGNATURE) == 0) {
    return PermissionDeniedError(keys_of + " are signed by a certificate whose keyUsage lacks digitalSignature");
  }
  return Status::Ok();
}

Status VerifyKeys(X509_STORE* store, const std::string& attempt, const AdvertisedKeys& keys) {
  const std::string keys_of = "the keys of worker " + std::to_string(keys.worker);
  if (keys.signature.empty()) {
    return PermissionDeniedError(keys_of + " carry no signature (every worker must sign its keys under mutual TLS)");
  }
  if (keys.certificate.empty()) {
    return PermissionDeniedError(keys_of + " carry a signature and no certificate to check it with");
  }
  const CertificatePtr certificate = ReadCertificate(keys.certificate);
  if (!certificate) return PermissionDeniedError(keys_of + " carry a certificate that is not PEM X.509");
  PARSYN_RETURN_IF_ERROR(CheckChain(store, certificate.get(), keys_of));
  const std::string expected = "worker-" + std::to_string(keys.worker);
  if (const std::optional<std::string> identity = CertificateIdentity(certificate.get()); identity != expected) {
    return PermissionDeniedError(keys_of + " are signed by a certificate for " +
                                 (identity ? "'" + *identity + "'" : "no usable name (neither a CN nor a DNS name)") +
                                 ", not '" + expected + "'");
  }
  if (!SignatureVerifies(X509_get0_pubkey(certificate.get()), SignedBytes(attempt, keys), keys.signature)) {
    return PermissionDeniedError(keys_of + " carry a signature that does not verify with their certificate's key " +
                                 "(keys changed after signing, or signed for another attempt than '" + attempt + "')");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<KeySigner> MakeKeySigner(const std::string& certificate_pem, const std::string& private_key_pem) {
  ERR_clear_error();
  const CertificatePtr certificate = ReadCertificate(certificate_pem);
  if (!certificate) {
    return InvalidArgumentError("the worker's certificate is not PEM X.509 (-----BEGIN CERTIFICATE-----)");
  }
  const BioPtr key_in = ReadOnlyBio(private_key_pem);
  PrivateKeyPtr key(key_in ? PEM_read_bio_PrivateKey(key_in.get(), nullptr, NoPassphrase, nullptr) : nullptr);
  if (!key) {
    ERR_clear_error();
    return InvalidArgumentError("the worker's private key is not an unencrypted PEM private key");
  }
  if (!CanSign(key.get())) {
    const char* type = EVP_PKEY_get0_type_name(key.get());
    return InvalidArgumentError("the worker's private key is of type " + std::string(type ? type : "unknown") +
                                ", which does not sign: keys are signed with ECDSA, RSA, Ed25519 or Ed448");
  }
  const EVP_PKEY* certified_key = X509_get0_pubkey(certificate.get());
  if (certified_key == nullptr || EVP_PKEY_eq(certified_key, key.get()) != 1) {
    ERR_clear_error();
    return InvalidArgumentError(
        "the worker's private key is not the key of its certificate (their public keys differ)");
  }
  // The certificate alone goes to the peers: a PEM file that also holds the private key must not send it along.
  const BioPtr out(BIO_new(BIO_s_mem()));
  char* pem = nullptr;
  long pem_bytes = 0;
  if (!out || PEM_write_bio_X509(out.get(), certificate.get()) != 1 ||
      (pem_bytes = BIO_get_mem_data(out.get(), &pem)) <= 0) {
    return InternalError("cannot write the worker's certificate as PEM: " + TakeOpenSslError());
  }
  KeySigner signer;
  signer.certificate_pem.assign(pem, static_cast<size_t>(pem_bytes));
  signer.sign = [shared_key = std::shared_ptr<EVP_PKEY>(std::move(key))](std::string_view bytes) {
    return Sign(shared_key.get(), bytes);
  };
  return signer;
}

StatusOr<KeyVerifier> MakeKeyVerifier(const std::string& ca_pem) {
  ERR_clear_error();
  const std::shared_ptr<X509_STORE> store(X509_STORE_new(), FreeWith<X509_STORE_free>());
  const BioPtr in = ReadOnlyBio(ca_pem);
  if (!store || !in) return InternalError("cannot hold the job's CA: " + TakeOpenSslError());
  int added = 0;
  while (const CertificatePtr ca{PEM_read_bio_X509(in.get(), nullptr, nullptr, nullptr)}) {
    if (X509_STORE_add_cert(store.get(), ca.get()) != 1) {
      return InternalError("cannot add a certificate of the job's CA: " + TakeOpenSslError());
    }
    ++added;
  }
  ERR_clear_error();  // the end of the PEM text reads as an error
  if (added == 0) return InvalidArgumentError("the job's CA holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
  return KeyVerifier([store](const std::string& attempt, const AdvertisedKeys& keys) {
    return VerifyKeys(store.get(), attempt, keys);
  });
}

}  // namespace parsyn::secagg
