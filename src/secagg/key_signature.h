// Authenticated keys under mutual TLS: a worker signs what it advertises (SignedBytes) with its client certificate's
// key, and its peers and the coordinator check the signature against the job's CA before they use a key. A coordinator
// that swaps a worker's keys for its own (a man in the middle between two workers) is then refused, where without
// signatures only an honest-but-curious coordinator is covered. OpenSSL 3; keys ECDSA (the coordinator issues P-256),
// RSA (PKCS#1 v1.5) or Ed25519/Ed448; SHA-256 except for the Edwards curves, which take no separate digest.
// The signer and the verifier hold their key or CA by shared ownership: copies share it, and any of them may be
// called from several threads at once.
#pragma once

#include <string>

#include "base/status.h"
#include "secagg/client.h"

namespace parsyn::secagg {

// A signer with the worker's client certificate and its private key, both PEM (the key unencrypted). It sends its
// peers the certificate alone, re-encoded: whatever else `certificate_pem` holds (a chain, a key) is not sent.
// InvalidArgument when either does not parse, when the key is of a kind that cannot sign (e.g. X25519), or when it
// is not the certificate's key. The signer's `sign` returns the raw signature, Internal if OpenSSL fails.
StatusOr<KeySigner> MakeKeySigner(const std::string& certificate_pem, const std::string& private_key_pem);

// A verifier that accepts a worker's advertised keys when, at the time of the call:
// - they carry a signature and a certificate (PEM X.509);
// - the certificate chains to one of the CA certificates in `ca_pem` and may serve as a TLS client certificate
//   (extKeyUsage clientAuth and keyUsage digitalSignature where the certificate restricts them), and is in its
//   validity period;
// - it names the worker, "worker-<keys.worker>": its subject CN, or its first DNS subjectAltName when it has no CN
//   (the coordinator's rule for the identity of a mutual-TLS client);
// - keys.signature verifies over SignedBytes(attempt, keys) with the certificate's key.
// Otherwise PermissionDenied naming the worker and what failed ("the keys of worker 7 are signed by a certificate
// for 'worker-9'"). MakeKeyVerifier itself fails with InvalidArgument when `ca_pem` holds no PEM certificate.
StatusOr<KeyVerifier> MakeKeyVerifier(const std::string& ca_pem);

}  // namespace parsyn::secagg
