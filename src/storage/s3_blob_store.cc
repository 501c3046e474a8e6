#include "storage/s3_blob_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "base/sha256.h"
#include "base/strings.h"
#include "base/temp_file.h"
#include "net/transport.h"

namespace parsyn::storage {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

constexpr size_t kReadChunkBytes = size_t{1} << 20;
// Error and listing bodies are small; a response larger than this is not S3 talking.
constexpr size_t kMaxResponseBodyBytes = size_t{16} << 20;
constexpr seconds kMaxPresignExpiry = seconds(7 * 24 * 3600);

std::string XmlUnescape(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '&') {
      out += text[i];
      continue;
    }
    size_t semi = text.find(';', i);
    if (semi == std::string_view::npos) {
      out += text.substr(i);
      break;
    }
    std::string_view entity = text.substr(i + 1, semi - i - 1);
    if (entity == "amp")
      out += '&';
    else if (entity == "lt")
      out += '<';
    else if (entity == "gt")
      out += '>';
    else if (entity == "quot")
      out += '"';
    else if (entity == "apos")
      out += '\'';
    else if (entity.starts_with("#x"))
      out += static_cast<char>(std::strtol(std::string(entity.substr(2)).c_str(), nullptr, 16));
    else if (entity.starts_with("#"))
      out += static_cast<char>(std::strtol(std::string(entity.substr(1)).c_str(), nullptr, 10));
    else
      out += std::string(text.substr(i, semi - i + 1));
    i = semi;
  }
  return out;
}

// The raw <tag>...</tag> blocks, in order (for lists of records such as <Part> or <Upload>). S3's responses are flat
// enough for this.
std::vector<std::string_view> XmlBlocks(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> out;
  std::string open = "<" + std::string(tag) + ">";
  std::string close = "</" + std::string(tag) + ">";
  size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    size_t end = xml.find(close, pos + open.size());
    if (end == std::string_view::npos) break;
    out.push_back(xml.substr(pos, end + close.size() - pos));
    pos = end + close.size();
  }
  return out;
}

// The (unescaped) text of every <tag>...</tag> in `xml`, in order.
std::vector<std::string> XmlValues(std::string_view xml, std::string_view tag) {
  const size_t open_size = tag.size() + 2;   // <tag>
  const size_t close_size = tag.size() + 3;  // </tag>
  std::vector<std::string> out;
  for (std::string_view block : XmlBlocks(xml, tag)) {
    out.push_back(XmlUnescape(block.substr(open_size, block.size() - open_size - close_size)));
  }
  return out;
}

std::string XmlValue(std::string_view xml, std::string_view tag) {
  std::vector<std::string> values = XmlValues(xml, tag);
  return values.empty() ? "" : values.front();
}

// The bytes of a Put, held until they are all read: in memory while small, else in an unlinked temp file.
class Spool {
 public:
  Spool() = default;
  explicit Spool(std::string bytes) : memory_(std::move(bytes)), size_(memory_.size()) {}
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;
  ~Spool() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Reads `source` to its end; on any error nothing has been sent anywhere.
  Status Fill(ByteSource& source, std::string_view key, const PutOptions& options, size_t memory_limit,
              const fs::path& dir) {
    Sha256 hasher;
    std::vector<std::byte> buffer(kReadChunkBytes);
    while (true) {
      PARSYN_ASSIGN_OR_RETURN(size_t n, source.Read(buffer));
      if (n == 0) break;
      if (options.max_size_bytes && size_ + n > *options.max_size_bytes) {
        return ResourceExhaustedError("blob '" + std::string(key) + "' is larger than the limit of " +
                                      std::to_string(*options.max_size_bytes) + " bytes");
      }
      std::span<const std::byte> chunk(buffer.data(), n);
      hasher.Update(chunk);
      PARSYN_RETURN_IF_ERROR(Append(chunk, memory_limit, dir));
      size_ += n;
    }
    sha256_ = hasher.HexDigest();
    if (options.expected_sha256 && *options.expected_sha256 != sha256_) {
      return DataLossError("blob '" + std::string(key) + "' has sha256 " + sha256_ + ", expected " +
                           *options.expected_sha256);
    }
    return Status::Ok();
  }

  uint64_t size() const { return size_; }
  const std::string& sha256() const { return sha256_; }

  // Copies up to `n` bytes from `offset`; returns how many (0 at the end). Thread-compatible (pread).
  StatusOr<size_t> ReadAt(uint64_t offset, char* out, size_t n) const {
    if (offset >= size_) return size_t{0};
    n = static_cast<size_t>(std::min<uint64_t>(n, size_ - offset));
    if (fd_ < 0) {
      std::memcpy(out, memory_.data() + offset, n);
      return n;
    }
    ssize_t got = ::pread(fd_, out, n, static_cast<off_t>(offset));
    if (got < 0) return UnavailableError(std::string("reading the upload spool file: ") + std::strerror(errno));
    return static_cast<size_t>(got);
  }

  // sha256 of bytes [offset, offset + length).
  StatusOr<std::string> Sha256Of(uint64_t offset, uint64_t length) const {
    Sha256 hasher;
    std::vector<char> buffer(kReadChunkBytes);
    uint64_t end = offset + length;
    while (offset < end) {
      PARSYN_ASSIGN_OR_RETURN(size_t n, ReadAt(offset, buffer.data(),
                                               static_cast<size_t>(std::min<uint64_t>(buffer.size(), end - offset))));
      if (n == 0) return InternalError("upload spool ended early");
      hasher.Update(std::string_view(buffer.data(), n));
      offset += n;
    }
    return hasher.HexDigest();
  }

 private:
  Status Append(std::span<const std::byte> chunk, size_t memory_limit, const fs::path& dir) {
    if (fd_ < 0 && memory_.size() + chunk.size() <= memory_limit) {
      memory_.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
      return Status::Ok();
    }
    if (fd_ < 0) {
      PARSYN_ASSIGN_OR_RETURN(TempFile spool, CreateTempFile(dir, "parsyn-s3-spool"));
      fd_ = spool.fd;
      ::unlink(spool.path.c_str());  // gone with the descriptor, even if we crash
      PARSYN_RETURN_IF_ERROR(WriteAll(memory_.data(), memory_.size()));
      memory_.clear();
      memory_.shrink_to_fit();
    }
    return WriteAll(reinterpret_cast<const char*>(chunk.data()), chunk.size());
  }

  Status WriteAll(const char* data, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, data, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return UnavailableError(std::string("writing the upload spool file: ") + std::strerror(errno));
      data += w;
      n -= static_cast<size_t>(w);
    }
    return Status::Ok();
  }

  std::string memory_;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string sha256_;
};

// A byte range of a spool sent as a request body.
class SpoolBody final : public net::RequestBody {
 public:
  SpoolBody(const Spool* spool, uint64_t offset, uint64_t length) : spool_(spool), offset_(offset), length_(length) {}
  Status Rewind() override {
    sent_ = 0;
    return Status::Ok();
  }
  uint64_t size() const override { return length_; }
  StatusOr<size_t> Read(char* out, size_t n) override {
    size_t want = static_cast<size_t>(std::min<uint64_t>(n, length_ - sent_));
    if (want == 0) return size_t{0};
    PARSYN_ASSIGN_OR_RETURN(size_t got, spool_->ReadAt(offset_ + sent_, out, want));
    if (got == 0) return InternalError("upload spool ended early");
    sent_ += got;
    return got;
  }

 private:
  const Spool* spool_;
  uint64_t offset_;
  uint64_t length_;
  uint64_t sent_ = 0;
};

// Headers libcurl would add on its own that S3 requests go without: no 100-continue round trip, no Accept.
void AddS3WireHeaders(net::Headers& headers) {
  headers.emplace_back("Expect", "");
  headers.emplace_back("Accept", "");
}

std::string Describe(const S3Request& request) {
  return request.method + " s3://" + request.bucket + "/" + request.key;
}

std::string ErrorDetail(long status, std::string_view body) {
  std::string code = XmlValue(body, "Code");
  std::string message = XmlValue(body, "Message");
  std::string detail = "HTTP " + std::to_string(status);
  if (!code.empty()) detail += " " + code;
  if (!message.empty()) detail += ": " + message;
  return detail;
}

// Maps an S3 error response to a Status. `blob_key` is the caller's key, named in NotFound/AlreadyExists messages.
Status ErrorFromResponse(const S3Request& request, std::string_view blob_key, long status, std::string_view body) {
  std::string code = XmlValue(body, "Code");
  std::string detail = ErrorDetail(status, body);
  std::string where = " (" + Describe(request) + ": " + detail + ")";
  if (code == "NoSuchBucket") return NotFoundError("bucket '" + request.bucket + "' does not exist" + where);
  if (code == "NoSuchUpload") {
    return NotFoundError("no multipart upload of blob '" + std::string(blob_key) + "' with that id" + where);
  }
  if (status == 404) return NotFoundError("blob '" + std::string(blob_key) + "' not found" + where);
  if (status == 412 || code == "PreconditionFailed" || code == "ConditionalRequestConflict") {
    return AlreadyExistsError("blob '" + std::string(blob_key) + "' already exists" + where);
  }
  if (status == 401 || status == 403) return PermissionDeniedError("S3 refused " + Describe(request) + ": " + detail);
  if (status >= 400 && status < 500) return InvalidArgumentError("S3 rejected " + Describe(request) + ": " + detail);
  return UnavailableError("S3 failed " + Describe(request) + ": " + detail);
}

// Transport failures read "S3 endpoint http://host failed during GET s3://bucket/key: <libcurl's words>", and are
// all Unavailable (timeouts too): the coordinator retries what is Unavailable.
Status DescribeTransportFailure(const S3Endpoint& endpoint, std::string_view what,
                                const net::TransferFailure& failure) {
  const std::string where = "S3 endpoint " + endpoint.scheme + "://" + endpoint.host;
  if (failure.kind == net::TransferFailure::Kind::kStalled) {
    return UnavailableError(where + " " + failure.reason + " during " + std::string(what));
  }
  return UnavailableError(where + " failed during " + std::string(what) + ": " + failure.reason);
}

// A Get() body pulled from the transport as the caller reads.
class S3GetStream final : public ByteSource {
 public:
  explicit S3GetStream(std::unique_ptr<net::ResponseStream> stream) : stream_(std::move(stream)) {}
  StatusOr<size_t> Read(std::span<std::byte> buffer) override { return stream_->Read(buffer); }

 private:
  std::unique_ptr<net::ResponseStream> stream_;
};

}  // namespace

// Signs requests and performs them through the transport (which keeps connections for reuse). No retries: callers
// decide.
class S3BlobStore::Http {
 public:
  explicit Http(const S3BlobStoreOptions& options) : options_(options), transport_(TransportOptionsFor(options)) {}

  // Performs `request` with `body` (nullptr: none) and returns the response, whatever its status.
  // Unavailable for transport failures.
  StatusOr<net::Response> Perform(const S3Request& request, std::string_view payload_sha256, net::RequestBody* body) {
    net::Request wire = Sign(request, payload_sha256);
    wire.body = body;
    wire.max_body_bytes = kMaxResponseBodyBytes;
    StatusOr<net::Response> response = transport_.Perform(wire);
    if (response.status().code() == StatusCode::kResourceExhausted) {
      return UnavailableError("S3 response to " + Describe(request) + " is over 16 MiB");
    }
    return response;
  }

  // Performs `request` and maps any non-2xx response (and a 200 carrying an <Error>, as CompleteMultipartUpload
  // may send) to a Status.
  StatusOr<net::Response> Call(const S3Request& request, std::string_view blob_key, std::string_view payload_sha256,
                               net::RequestBody* body = nullptr) {
    PARSYN_ASSIGN_OR_RETURN(net::Response response, Perform(request, payload_sha256, body));
    if (response.status < 200 || response.status >= 300) {
      return ErrorFromResponse(request, blob_key, response.status, response.body);
    }
    if (response.body.find("<Error>") != std::string::npos) {
      return ErrorFromResponse(request, blob_key, 500, response.body);
    }
    return response;
  }

  StatusOr<std::unique_ptr<ByteSource>> Stream(const S3Request& request, std::string_view blob_key) {
    PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<net::ResponseStream> stream,
                            transport_.Open(Sign(request, Sha256HexOf(""))));
    const net::Response& response = stream->response();
    if (response.status != 200) return ErrorFromResponse(request, blob_key, response.status, response.body);
    return std::unique_ptr<ByteSource>(std::make_unique<S3GetStream>(std::move(stream)));
  }

 private:
  static net::TransportOptions TransportOptionsFor(const S3BlobStoreOptions& options) {
    net::TransportOptions transport;
    transport.connect_timeout = options.connect_timeout;
    transport.stall_timeout = options.stall_timeout;
    transport.max_attempts = 1;
    transport.max_error_body_bytes = kMaxResponseBodyBytes;
    transport.path_as_is = true;  // S3 keys may contain "./": send the path as signed
    transport.http_1_1 = true;
    transport.tcp_keepalive = true;
    transport.describe_failure = [endpoint = options.endpoint](std::string_view what,
                                                               const net::TransferFailure& failure) {
      return DescribeTransportFailure(endpoint, what, failure);
    };
    return transport;
  }

  net::Request Sign(const S3Request& request, std::string_view payload_sha256) const {
    SignedS3Request signed_request =
        SignS3Request(options_.endpoint, options_.credentials, request, payload_sha256, options_.now());
    net::Request wire;
    wire.method = request.method;
    wire.url = std::move(signed_request.url);
    wire.headers = std::move(signed_request.headers);
    AddS3WireHeaders(wire.headers);
    wire.what = Describe(request);
    return wire;
  }

  const S3BlobStoreOptions& options_;
  net::Transport transport_;
};

namespace {

StatusOr<std::string> RequireSha256(std::optional<std::string> sha256) {
  if (!sha256) return std::string();
  bool hex = sha256->size() == 64 && std::all_of(sha256->begin(), sha256->end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
             });
  if (!hex) return InvalidArgumentError("sha256 must be 64 lowercase hex digits, got '" + *sha256 + "'");
  return *sha256;
}

Status CheckExpiry(seconds expires) {
  if (expires < seconds(1) || expires > kMaxPresignExpiry) {
    return InvalidArgumentError("presigned URL expiry must be 1 s to 7 days, got " + std::to_string(expires.count()) +
                                " s");
  }
  return Status::Ok();
}

}  // namespace

S3BlobStore::S3BlobStore(S3BlobStoreOptions options)
    : options_(std::move(options)), http_(std::make_unique<Http>(options_)) {}

S3BlobStore::~S3BlobStore() = default;

StatusOr<std::unique_ptr<S3BlobStore>> S3BlobStore::Create(S3BlobStoreOptions options) {
  if (!IsValidS3BucketName(options.bucket)) {
    return InvalidArgumentError("'" + options.bucket + "' is not a valid S3 bucket name (3-63 of a-z 0-9 . -)");
  }
  if (!options.prefix.empty()) {
    if (!options.prefix.ends_with('/')) return InvalidArgumentError("S3 key prefix must end with '/'");
    PARSYN_RETURN_IF_ERROR(ValidateBlobKey(std::string_view(options.prefix).substr(0, options.prefix.size() - 1)));
  }
  if (options.part_size_bytes < (uint64_t{5} << 20) && options.part_size_bytes < options.multipart_threshold_bytes) {
    // S3 refuses parts under 5 MiB (except the last); moto does too. Small parts only make sense in tests, where
    // the threshold is small as well; refuse settings that would always fail.
    return InvalidArgumentError("S3 multipart part size must be at least 5 MiB, got " +
                                std::to_string(options.part_size_bytes) + " bytes");
  }
  if (options.part_size_bytes == 0) return InvalidArgumentError("S3 multipart part size must be positive");
  if (options.spool_dir.empty()) options.spool_dir = fs::temp_directory_path();
  if (options.list_page_size < 1 || options.list_page_size > 1000) {
    return InvalidArgumentError("S3 list page size must be 1 to 1000");
  }
  return std::unique_ptr<S3BlobStore>(new S3BlobStore(std::move(options)));
}

StatusOr<BlobInfo> S3BlobStore::Put(std::string_view key, ByteSource& data, const PutOptions& options) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  Spool spool;
  PARSYN_RETURN_IF_ERROR(spool.Fill(data, key, options, options_.memory_spool_bytes, options_.spool_dir));
  BlobInfo info{std::string(key), spool.size(), spool.sha256()};
  HttpHeaders metadata = {{"x-amz-meta-sha256", info.sha256}};

  if (spool.size() <= options_.multipart_threshold_bytes) {
    S3Request request{.method = "PUT",
                      .bucket = options_.bucket,
                      .key = ObjectKey(key),
                      .query = {},
                      .headers = {{"If-None-Match", "*"}, metadata[0]}};
    SpoolBody body{&spool, 0, spool.size()};
    PARSYN_RETURN_IF_ERROR(http_->Call(request, key, info.sha256, &body).status());
    return info;
  }

  PARSYN_ASSIGN_OR_RETURN(std::string upload_id, StartMultipartUpload(key, info.sha256));
  auto upload_parts = [&]() -> Status {
    int part_number = 1;
    for (uint64_t offset = 0; offset < spool.size(); offset += options_.part_size_bytes, ++part_number) {
      uint64_t length = std::min<uint64_t>(options_.part_size_bytes, spool.size() - offset);
      PARSYN_ASSIGN_OR_RETURN(std::string part_sha256, spool.Sha256Of(offset, length));
      S3Request request{.method = "PUT",
                        .bucket = options_.bucket,
                        .key = ObjectKey(key),
                        .query = {{"uploadId", upload_id}, {"partNumber", std::to_string(part_number)}},
                        .headers = {}};
      SpoolBody body{&spool, offset, length};
      PARSYN_RETURN_IF_ERROR(http_->Call(request, key, part_sha256, &body).status());
    }
    return CompleteMultipartUpload(key, upload_id).status();
  };
  if (Status s = upload_parts(); !s.ok()) {
    // Best effort: an upload left behind is also removed by AbortIncompleteUploads.
    AbortMultipartUpload(key, upload_id).IgnoreError();
    return s;
  }
  return info;
}

StatusOr<std::unique_ptr<ByteSource>> S3BlobStore::Get(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  S3Request request{.method = "GET", .bucket = options_.bucket, .key = ObjectKey(key), .query = {}, .headers = {}};
  return http_->Stream(request, key);
}

StatusOr<BlobInfo> S3BlobStore::HeadObject(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  S3Request request{.method = "HEAD", .bucket = options_.bucket, .key = ObjectKey(key), .query = {}, .headers = {}};
  PARSYN_ASSIGN_OR_RETURN(net::Response response, http_->Call(request, key, Sha256HexOf("")));
  return BlobInfo{std::string(key), std::strtoull(response.headers["content-length"].c_str(), nullptr, 10),
                  response.headers["x-amz-meta-sha256"]};
}

StatusOr<BlobInfo> S3BlobStore::Head(std::string_view key) {
  PARSYN_ASSIGN_OR_RETURN(BlobInfo info, HeadObject(key));
  if (info.sha256.empty()) {
    // Written without our metadata (another tool, or a presigned PUT that did not declare it): hash the bytes.
    PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source, Get(key));
    Sha256 hasher;
    std::vector<std::byte> buffer(kReadChunkBytes);
    uint64_t size = 0;
    while (true) {
      PARSYN_ASSIGN_OR_RETURN(size_t n, source->Read(buffer));
      if (n == 0) break;
      hasher.Update(std::span<const std::byte>(buffer.data(), n));
      size += n;
    }
    info.sha256 = hasher.HexDigest();
    info.size_bytes = size;
  }
  return info;
}

StatusOr<fs::path> S3BlobStore::LocalPath(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(HeadObject(key).status());  // NotFound first; never a download just to say "no file"
  return FailedPreconditionError("blob '" + std::string(key) + "' is in S3 and has no local file; read it with Get()");
}

Status S3BlobStore::Delete(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  S3Request head{.method = "HEAD", .bucket = options_.bucket, .key = ObjectKey(key), .query = {}, .headers = {}};
  PARSYN_RETURN_IF_ERROR(http_->Call(head, key, Sha256HexOf("")).status());
  S3Request request{.method = "DELETE", .bucket = options_.bucket, .key = ObjectKey(key), .query = {}, .headers = {}};
  return http_->Call(request, key, Sha256HexOf("")).status();
}

StatusOr<std::vector<std::string>> S3BlobStore::List(std::string_view prefix) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKeyPrefix(prefix));
  std::vector<std::string> keys;
  std::string token;
  while (true) {
    S3Request request{.method = "GET",
                      .bucket = options_.bucket,
                      .key = "",
                      .query = {{"list-type", "2"},
                                {"max-keys", std::to_string(options_.list_page_size)},
                                {"prefix", ObjectKey(prefix)}},
                      .headers = {}};
    if (!token.empty()) request.query.emplace_back("continuation-token", token);
    PARSYN_ASSIGN_OR_RETURN(net::Response response, http_->Call(request, prefix, Sha256HexOf("")));
    for (std::string& object_key : XmlValues(response.body, "Key")) {
      std::string key = object_key.substr(std::min(object_key.size(), options_.prefix.size()));
      // Objects under the prefix that are not blob keys were not written by a BlobStore: not ours to list.
      if (object_key.starts_with(options_.prefix) && ValidateBlobKey(key).ok()) keys.push_back(std::move(key));
    }
    if (XmlValue(response.body, "IsTruncated") != "true") break;
    token = XmlValue(response.body, "NextContinuationToken");
    if (token.empty()) return UnavailableError("S3 listing is truncated but has no continuation token");
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

StatusOr<PresignedRequest> S3BlobStore::Presign(S3Request request, seconds expires) const {
  PARSYN_RETURN_IF_ERROR(CheckExpiry(expires));
  auto now = options_.now();
  PresignedRequest presigned;
  presigned.method = request.method;
  presigned.url = PresignS3Url(options_.endpoint, options_.credentials, request, expires, now);
  presigned.headers = request.headers;
  presigned.expires_at = now + expires;
  return presigned;
}

StatusOr<PresignedRequest> S3BlobStore::PresignGet(std::string_view key, seconds expires) const {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  return Presign({.method = "GET", .bucket = options_.bucket, .key = ObjectKey(key), .query = {}, .headers = {}},
                 expires);
}

StatusOr<PresignedRequest> S3BlobStore::PresignPut(std::string_view key, seconds expires,
                                                   std::optional<std::string> sha256) const {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  PARSYN_ASSIGN_OR_RETURN(std::string hex, RequireSha256(std::move(sha256)));
  S3Request request{.method = "PUT",
                    .bucket = options_.bucket,
                    .key = ObjectKey(key),
                    .query = {},
                    .headers = {{"If-None-Match", "*"}}};
  if (!hex.empty()) request.headers.emplace_back("x-amz-meta-sha256", hex);
  return Presign(std::move(request), expires);
}

StatusOr<std::string> S3BlobStore::StartMultipartUpload(std::string_view key, std::optional<std::string> sha256) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  PARSYN_ASSIGN_OR_RETURN(std::string hex, RequireSha256(std::move(sha256)));
  S3Request request{
      .method = "POST", .bucket = options_.bucket, .key = ObjectKey(key), .query = {{"uploads", ""}}, .headers = {}};
  if (!hex.empty()) request.headers.emplace_back("x-amz-meta-sha256", hex);
  Spool empty;
  SpoolBody body{&empty, 0, 0};
  PARSYN_ASSIGN_OR_RETURN(net::Response response, http_->Call(request, key, Sha256HexOf(""), &body));
  std::string upload_id = XmlValue(response.body, "UploadId");
  if (upload_id.empty()) return UnavailableError("S3 CreateMultipartUpload answer has no UploadId");
  return upload_id;
}

StatusOr<PresignedRequest> S3BlobStore::PresignUploadPart(std::string_view key, std::string_view upload_id,
                                                          int part_number, seconds expires) const {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  if (part_number < 1 || part_number > 10000) {
    return InvalidArgumentError("part number must be 1 to 10000, got " + std::to_string(part_number));
  }
  if (upload_id.empty()) return InvalidArgumentError("empty multipart upload id");
  return Presign({.method = "PUT",
                  .bucket = options_.bucket,
                  .key = ObjectKey(key),
                  .query = {{"uploadId", std::string(upload_id)}, {"partNumber", std::to_string(part_number)}},
                  .headers = {}},
                 expires);
}

StatusOr<std::string> S3BlobStore::GetUrl(std::string_view key, seconds ttl) const {
  PARSYN_ASSIGN_OR_RETURN(PresignedRequest get, PresignGet(key, ttl));
  return std::move(get.url);
}

StatusOr<UrlGrant> S3BlobStore::PutGrant(std::string_view key, seconds ttl) const {
  PARSYN_ASSIGN_OR_RETURN(PresignedRequest put, PresignPut(key, ttl));
  return UrlGrant{.url = std::move(put.url), .headers = std::move(put.headers)};
}

seconds S3BlobStore::max_ttl() const { return kMaxPresignExpiry; }

StatusOr<UrlGrant> S3BlobStore::PartGrant(std::string_view key, std::string_view upload_id, int part_number,
                                          seconds ttl) const {
  PARSYN_ASSIGN_OR_RETURN(PresignedRequest part, PresignUploadPart(key, upload_id, part_number, ttl));
  return UrlGrant{.url = std::move(part.url), .headers = std::move(part.headers)};
}

StatusOr<std::vector<UploadedPart>> S3BlobStore::ListUploadedParts(std::string_view key, std::string_view upload_id) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  std::vector<UploadedPart> parts;
  std::string marker;
  while (true) {
    S3Request request{.method = "GET",
                      .bucket = options_.bucket,
                      .key = ObjectKey(key),
                      .query = {{"uploadId", std::string(upload_id)}},
                      .headers = {}};
    if (!marker.empty()) request.query.emplace_back("part-number-marker", marker);
    PARSYN_ASSIGN_OR_RETURN(net::Response response, http_->Call(request, key, Sha256HexOf("")));
    for (std::string_view block : XmlBlocks(response.body, "Part")) {
      parts.push_back({std::atoi(XmlValue(block, "PartNumber").c_str()),
                       std::strtoull(XmlValue(block, "Size").c_str(), nullptr, 10), XmlValue(block, "ETag")});
    }
    if (XmlValue(response.body, "IsTruncated") != "true") break;
    marker = XmlValue(response.body, "NextPartNumberMarker");
    if (marker.empty()) return UnavailableError("S3 ListParts is truncated but has no next marker");
  }
  std::sort(parts.begin(), parts.end(),
            [](const UploadedPart& a, const UploadedPart& b) { return a.part_number < b.part_number; });
  return parts;
}

StatusOr<BlobInfo> S3BlobStore::CompleteMultipartUpload(std::string_view key, std::string_view upload_id) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<UploadedPart> parts, ListUploadedParts(key, upload_id));
  if (parts.empty()) {
    return InvalidArgumentError("multipart upload of blob '" + std::string(key) + "' has no parts to complete");
  }
  std::string xml = "<CompleteMultipartUpload>";
  for (const UploadedPart& part : parts) {
    xml += "<Part><PartNumber>" + std::to_string(part.part_number) + "</PartNumber><ETag>" + XmlEscape(part.etag) +
           "</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  std::string xml_sha256 = Sha256HexOf(xml);
  Spool document(std::move(xml));
  SpoolBody body{&document, 0, document.size()};
  S3Request request{.method = "POST",
                    .bucket = options_.bucket,
                    .key = ObjectKey(key),
                    .query = {{"uploadId", std::string(upload_id)}},
                    .headers = {{"If-None-Match", "*"}, {"Content-Type", "application/xml"}}};
  StatusOr<net::Response> response = http_->Call(request, key, xml_sha256, &body);
  if (response.status().code() == StatusCode::kAlreadyExists) {
    AbortMultipartUpload(key, upload_id).IgnoreError();  // its parts can never be used now
  }
  PARSYN_RETURN_IF_ERROR(response.status());
  return HeadObject(key);
}

Status S3BlobStore::AbortMultipartUpload(std::string_view key, std::string_view upload_id) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  S3Request request{.method = "DELETE",
                    .bucket = options_.bucket,
                    .key = ObjectKey(key),
                    .query = {{"uploadId", std::string(upload_id)}},
                    .headers = {}};
  return http_->Call(request, key, Sha256HexOf("")).status();
}

StatusOr<std::vector<IncompleteUpload>> S3BlobStore::ListIncompleteUploads(std::string_view prefix) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKeyPrefix(prefix));
  std::vector<IncompleteUpload> uploads;
  std::string key_marker, upload_marker;
  while (true) {
    S3Request request{.method = "GET",
                      .bucket = options_.bucket,
                      .key = "",
                      .query = {{"uploads", ""}, {"prefix", ObjectKey(prefix)}},
                      .headers = {}};
    if (!key_marker.empty()) {
      request.query.emplace_back("key-marker", key_marker);
      request.query.emplace_back("upload-id-marker", upload_marker);
    }
    PARSYN_ASSIGN_OR_RETURN(net::Response response, http_->Call(request, prefix, Sha256HexOf("")));
    for (std::string_view block : XmlBlocks(response.body, "Upload")) {
      std::string object_key = XmlValue(block, "Key");
      if (!object_key.starts_with(options_.prefix)) continue;
      if (!ValidateBlobKey(std::string_view(object_key).substr(options_.prefix.size())).ok()) continue;
      uploads.push_back({object_key.substr(options_.prefix.size()), XmlValue(block, "UploadId")});
    }
    if (XmlValue(response.body, "IsTruncated") != "true") break;
    key_marker = XmlValue(response.body, "NextKeyMarker");
    upload_marker = XmlValue(response.body, "NextUploadIdMarker");
    if (key_marker.empty()) return UnavailableError("S3 ListMultipartUploads is truncated but has no next marker");
  }
  return uploads;
}

StatusOr<int> S3BlobStore::AbortIncompleteUploads(std::string_view prefix) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<IncompleteUpload> uploads, ListIncompleteUploads(prefix));
  int aborted = 0;
  for (const IncompleteUpload& upload : uploads) {
    Status s = AbortMultipartUpload(upload.key, upload.upload_id);
    if (s.code() == StatusCode::kNotFound) continue;  // completed or aborted by someone else meanwhile
    PARSYN_RETURN_IF_ERROR(s);
    ++aborted;
  }
  return aborted;
}

StatusOr<std::unique_ptr<BlobStore>> OpenS3BlobStore(std::string_view uri) {
  PARSYN_ASSIGN_OR_RETURN(S3BlobStoreOptions options, ParseS3BlobStoreUri(uri, ProcessEnv()));
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<S3BlobStore> store, S3BlobStore::Create(std::move(options)));
  return std::unique_ptr<BlobStore>(std::move(store));
}

}  // namespace parsyn::storage
