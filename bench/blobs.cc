// bench_blobs: upload and download throughput of one large blob through the S3 store (libcurl + SigV4 against a
// moto_server on loopback, multipart above 64 MiB) and through the directory store, in the same run, with the ratio.
//
// Usage: bench_blobs [MiB]   (default 1024). The blob is generated on the fly and read back in 1 MiB chunks into a
// SHA-256, so the program itself never holds it: peak RSS is printed to show that memory stays bounded. Both stores
// work in the same temp directory's file system (the S3 store spools the upload there, the directory store writes
// it there), and moto keeps what it receives in its own process.
// moto_server is a Python server: its speed, not the client's, bounds the S3 figures; what this shows is the
// client's overhead and that 1 GiB streams through with bounded memory.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/sha256.h"
#include "storage/directory_blob_store.h"
#include "storage/s3_blob_store.h"
#include "storage/s3_moto_for_test.h"
#include "storage/temp_dir_for_test.h"

namespace {

using parsyn::Status;
using parsyn::StatusOr;
using parsyn::storage::BlobStore;
using parsyn::storage::ByteSource;

// `size` pseudo-random bytes, produced as they are read.
class GeneratedSource final : public ByteSource {
 public:
  explicit GeneratedSource(uint64_t size) : remaining_(size) {}
  StatusOr<size_t> Read(std::span<std::byte> buffer) override {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), remaining_));
    for (size_t i = 0; i < n; i += 8) {
      state_ ^= state_ << 13;
      state_ ^= state_ >> 7;
      state_ ^= state_ << 17;
      std::memcpy(buffer.data() + i, &state_, std::min<size_t>(8, n - i));
    }
    remaining_ -= n;
    return n;
  }

 private:
  uint64_t remaining_;
  uint64_t state_ = 0x9e3779b97f4a7c15ull;
};

double Seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

long PeakRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;
}

void Die(const std::string& what, const Status& status) {
  std::fprintf(stderr, "bench_blobs: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

struct Throughput {
  double upload_mib_s = 0;
  double download_mib_s = 0;
  std::string sha256;
};

Throughput Measure(BlobStore& store, const std::string& key, uint64_t size) {
  const double mib = static_cast<double>(size) / (1 << 20);
  Throughput result;
  GeneratedSource source(size);
  double start = Seconds();
  StatusOr<parsyn::storage::BlobInfo> put = store.Put(key, source);
  if (!put.ok()) Die("put " + key, put.status());
  result.upload_mib_s = mib / (Seconds() - start);

  start = Seconds();
  StatusOr<std::unique_ptr<ByteSource>> get = store.Get(key);
  if (!get.ok()) Die("get " + key, get.status());
  std::vector<std::byte> buffer(size_t{1} << 20);
  parsyn::Sha256 hasher;
  uint64_t total = 0;
  while (true) {
    StatusOr<size_t> n = (*get)->Read(buffer);
    if (!n.ok()) Die("read " + key, n.status());
    if (*n == 0) break;
    hasher.Update(std::span<const std::byte>(buffer.data(), *n));
    total += *n;
  }
  result.download_mib_s = mib / (Seconds() - start);
  result.sha256 = hasher.HexDigest();
  if (total != size || result.sha256 != put->sha256) {
    Die("verify " + key, parsyn::DataLossError("read back " + std::to_string(total) + " bytes, sha256 " +
                                               result.sha256 + " vs put " + put->sha256));
  }
  if (Status s = store.Delete(key); !s.ok()) Die("delete " + key, s);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  const uint64_t size = mib << 20;
  parsyn::storage::TempDirForTest dir;

  auto directory = parsyn::storage::DirectoryBlobStore::Open(dir.path() / "blobs");
  if (!directory.ok()) Die("opening the directory store", directory.status());

  if (!parsyn::storage::FindMotoServer()) {
    std::printf("bench_blobs: moto_server is not installed; skipping the S3 comparison\n");
    return 0;
  }
  auto server = parsyn::storage::MotoServer::Start();
  if (!server.ok()) Die("starting moto_server", server.status());
  if (Status s = (*server)->CreateBucket("bench-blobs"); !s.ok()) Die("creating the bucket", s);
  parsyn::storage::S3BlobStoreOptions options;
  options.bucket = "bench-blobs";
  options.prefix = "bench/";
  options.endpoint = {.scheme = "http",
                      .host = "127.0.0.1:" + std::to_string((*server)->port()),
                      .region = "us-east-1",
                      .path_style = true};
  options.credentials = {"testing", "testing", ""};
  options.spool_dir = dir.path();
  auto s3 = parsyn::storage::S3BlobStore::Create(options);
  if (!s3.ok()) Die("creating the S3 store", s3.status());

  std::printf("blob: %llu MiB, generated while read; read back through a 1 MiB buffer into SHA-256\n",
              static_cast<unsigned long long>(mib));
  Throughput local = Measure(**directory, "blob.bin", size);
  std::printf("directory store   upload %8.1f MiB/s   download %8.1f MiB/s\n", local.upload_mib_s,
              local.download_mib_s);
  Throughput remote = Measure(**s3, "blob.bin", size);
  std::string mode = size > options.multipart_threshold_bytes
                         ? "multipart, " + std::to_string(options.part_size_bytes >> 20) + " MiB parts"
                         : std::string("single PUT");
  std::printf("S3 (moto_server)  upload %8.1f MiB/s   download %8.1f MiB/s   (%s)\n", remote.upload_mib_s,
              remote.download_mib_s, mode.c_str());
  std::printf("S3 / directory    upload %8.3f x        download %8.3f x\n", remote.upload_mib_s / local.upload_mib_s,
              remote.download_mib_s / local.download_mib_s);
  std::printf("peak RSS of this process: %ld MiB (the blob is %llu MiB)\n", PeakRssMiB(),
              static_cast<unsigned long long>(mib));
  return 0;
}
