#include "net/transport.h"

#include <curl/curl.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>

#include "base/clock.h"
#include "base/log.h"
#include "base/strings.h"

namespace parsyn::net {

namespace {

struct EasyDeleter {
  void operator()(CURL* curl) const { curl_easy_cleanup(curl); }
};
struct MultiDeleter {
  void operator()(CURLM* multi) const { curl_multi_cleanup(multi); }
};
struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using EasyHandle = std::unique_ptr<CURL, EasyDeleter>;
using MultiHandle = std::unique_ptr<CURLM, MultiDeleter>;
using HeaderList = std::unique_ptr<curl_slist, SlistDeleter>;
using File = std::unique_ptr<std::FILE, FileCloser>;

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

bool IsRetryableCurlError(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_OPERATION_TIMEDOUT: return true;
    default: return false;
  }
}

bool IsRetryableStatus(long status) { return status == 502 || status == 503 || status == 504; }

TransferFailure FailureOf(CURLcode rc, const char* error_buffer, long os_errno) {
  TransferFailure failure;
  failure.reason = error_buffer[0] ? error_buffer : curl_easy_strerror(rc);
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
      failure.kind = os_errno == ECONNREFUSED ? TransferFailure::Kind::kRefused : TransferFailure::Kind::kCannotConnect;
      break;
    case CURLE_COULDNT_RESOLVE_HOST: failure.kind = TransferFailure::Kind::kCannotResolve; break;
    case CURLE_OPERATION_TIMEDOUT: failure.kind = TransferFailure::Kind::kTimedOut; break;
    default: failure.kind = TransferFailure::Kind::kOther;
  }
  return failure;
}

HeaderList MakeHeaderList(const Headers& headers) {
  curl_slist* list = nullptr;
  for (const auto& [name, value] : headers) {
    // "Name:" with nothing after the colon tells libcurl to leave out a header it would add itself (Expect, Accept).
    const std::string line = value.empty() ? name + ":" : name + ": " + value;
    list = curl_slist_append(list, line.c_str());
  }
  return HeaderList(list);
}

// A header line into `headers`; a status line starts a new response (after 100 Continue or a redirect).
void CollectHeader(std::string_view line, HeaderMap& headers) {
  if (line.starts_with("HTTP/")) {
    headers.clear();
  } else if (size_t colon = line.find(':'); colon != std::string_view::npos) {
    headers[ToLower(Trim(line.substr(0, colon)))] = std::string(Trim(line.substr(colon + 1)));
  }
}

// CURLOPT_SSL_CTX_FUNCTION: trusts the certificates in the file at `path` besides the store libcurl set up (the
// system's). Each is a trust anchor even when it is not self-signed (X509_V_FLAG_PARTIAL_CHAIN), so the file may
// hold a server's own certificate (pinning it) as well as a CA. The host name is still checked.
CURLcode AddExtraCa(CURL*, void* ssl_ctx, void* path) {
  auto* ctx = static_cast<SSL_CTX*>(ssl_ctx);
  if (X509_STORE_load_locations(SSL_CTX_get_cert_store(ctx), static_cast<const char*>(path), nullptr) != 1) {
    PARSYN_LOG_ERROR("cannot load the CA file {}", static_cast<const char*>(path));
    return CURLE_SSL_CACERT_BADFILE;
  }
  X509_VERIFY_PARAM_set_flags(SSL_CTX_get0_param(ctx), X509_V_FLAG_PARTIAL_CHAIN);
  return CURLE_OK;
}

// The options every transfer shares.
void SetCommonOptions(CURL* curl, const TransportOptions& options, const std::string& url, curl_slist* headers,
                      char* error_buffer) {
  error_buffer[0] = '\0';
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options.connect_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (options.path_as_is) curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);
  if (options.http_1_1) curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
  if (options.tcp_keepalive) curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  if (!options.ca_file.empty()) {
    // Added to the default store when the TLS backend is OpenSSL; elsewhere the file replaces the default bundle.
    if (curl_easy_setopt(curl, CURLOPT_SSL_CTX_FUNCTION, &AddExtraCa) != CURLE_OK ||
        curl_easy_setopt(curl, CURLOPT_SSL_CTX_DATA, const_cast<char*>(options.ca_file.c_str())) != CURLE_OK) {
      curl_easy_setopt(curl, CURLOPT_CAINFO, options.ca_file.c_str());
    }
  }
  if (!options.client_cert_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLCERT, options.client_cert_file.c_str());
  if (!options.client_key_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, options.client_key_file.c_str());
}

std::string What(const Request& request) {
  return request.what.empty() ? request.method + " " + WithoutQuery(request.url) : request.what;
}

// One attempt of Perform: the callbacks' state.
struct Attempt {
  const Request* request = nullptr;
  const TransportOptions* options = nullptr;
  CURL* curl = nullptr;
  Response response;
  Status body_error;
  uint64_t body_sent = 0;
  bool too_big = false;
  bool stopped_by_sink = false;

  bool Success() const {
    long code = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    return code >= 200 && code < 300;
  }

  static size_t OnWrite(char* data, size_t size, size_t count, void* self_ptr) {
    auto& a = *static_cast<Attempt*>(self_ptr);
    const size_t n = size * count;
    const bool success = a.Success();
    if (!success || !a.request->sink) {
      // Error bodies are kept (they carry the message) but bounded: their head is enough.
      const uint64_t cap = success ? a.request->max_body_bytes : a.options->max_error_body_bytes;
      if (a.response.body.size() + n > cap) {
        if (!success) return n;
        a.too_big = true;
        return 0;
      }
      a.response.body.append(data, n);
      return n;
    }
    if (!a.request->sink->Write(std::string_view(data, n))) {
      a.stopped_by_sink = true;
      return 0;
    }
    return n;
  }

  static size_t OnRead(char* buffer, size_t size, size_t count, void* self_ptr) {
    auto& a = *static_cast<Attempt*>(self_ptr);
    StatusOr<size_t> n = a.request->body->Read(buffer, size * count);
    if (!n.ok()) {
      a.body_error = n.status();
      return CURL_READFUNC_ABORT;
    }
    // A body that ends early (a file that shrank under us) would make curl wait for bytes that never come.
    if (*n == 0 && a.body_sent < a.request->body->size()) return CURL_READFUNC_ABORT;
    a.body_sent += *n;
    return *n;
  }

  static size_t OnHeader(char* data, size_t size, size_t count, void* self_ptr) {
    CollectHeader(std::string_view(data, size * count), static_cast<Attempt*>(self_ptr)->response.headers);
    return size * count;
  }

  static int OnProgress(void* self_ptr, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<Attempt*>(self_ptr)->request->stop.stop_requested() ? 1 : 0;
  }
};

// Bytes of a file, reopened per attempt so that a retry starts again at `offset`.
class FileRangeBody final : public RequestBody {
 public:
  FileRangeBody(std::filesystem::path file, uint64_t offset, std::optional<uint64_t> length)
      : file_(std::move(file)), offset_(offset), length_(length) {}

  Status Rewind() override {
    in_.reset(std::fopen(file_.c_str(), "rb"));
    if (!in_) return NotFoundError("cannot open '" + file_.string() + "' for upload: " + std::strerror(errno));
    std::error_code ec;
    const uint64_t file_size = std::filesystem::file_size(file_, ec);
    if (ec) return NotFoundError("cannot stat '" + file_.string() + "': " + ec.message());
    if (!length_) {
      size_ = file_size;
    } else {
      if (offset_ > file_size || *length_ > file_size - offset_) {
        return InvalidArgumentError("bytes " + std::to_string(offset_) + "+" + std::to_string(*length_) +
                                    " lie beyond the " + std::to_string(file_size) + " bytes of '" + file_.string() +
                                    "'");
      }
      if (::fseeko(in_.get(), static_cast<off_t>(offset_), SEEK_SET) != 0) {
        return InternalError("cannot seek in '" + file_.string() + "': " + std::strerror(errno));
      }
      size_ = *length_;
    }
    left_ = size_;
    return Status::Ok();
  }

  uint64_t size() const override { return size_; }

  StatusOr<size_t> Read(char* out, size_t n) override {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(n, left_));
    if (want == 0) return size_t{0};
    const size_t got = std::fread(out, 1, want, in_.get());
    left_ -= got;
    return got;
  }

 private:
  std::filesystem::path file_;
  uint64_t offset_;
  std::optional<uint64_t> length_;
  File in_;
  uint64_t size_ = 0;
  uint64_t left_ = 0;
};

class MemoryRequestBody final : public RequestBody {
 public:
  explicit MemoryRequestBody(std::string_view bytes) : bytes_(bytes) {}
  Status Rewind() override {
    offset_ = 0;
    return Status::Ok();
  }
  uint64_t size() const override { return bytes_.size(); }
  StatusOr<size_t> Read(char* out, size_t n) override {
    n = std::min(n, bytes_.size() - offset_);
    std::memcpy(out, bytes_.data() + offset_, n);
    offset_ += n;
    return n;
  }

 private:
  std::string_view bytes_;
  size_t offset_ = 0;
};

// Transport::Open's stream: libcurl's multi interface is driven inside Read(), and the transfer is paused whenever
// ~1 MiB is waiting, so memory stays bounded.
class PulledResponse final : public ResponseStream {
 public:
  PulledResponse(const TransportOptions& options, const Request& request)
      : options_(options), what_(What(request)), url_(request.url), headers_(MakeHeaderList(request.headers)) {}
  ~PulledResponse() override {
    if (multi_ && easy_) curl_multi_remove_handle(multi_.get(), easy_.get());
  }

  // Sends the request and waits for the response headers; a non-2xx body is read whole.
  Status Start(const std::string& method) {
    EasyHandle easy(curl_easy_init());
    MultiHandle multi(curl_multi_init());
    if (!easy || !multi) return InternalError(what_ + ": curl initialisation failed");
    CURL* curl = easy.get();
    SetCommonOptions(curl, options_, url_, headers_.get(), error_buffer_);
    if (method == "GET") {
      curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    } else {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
    }
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &PulledResponse::OnHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, this);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &PulledResponse::OnBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, this);
    curl_multi_add_handle(multi.get(), curl);
    easy_ = std::move(easy);
    multi_ = std::move(multi);
    while (!headers_done_ && !finished_) PARSYN_RETURN_IF_ERROR(Drive());
    PARSYN_RETURN_IF_ERROR(transfer_status_);
    long status = 0;
    curl_easy_getinfo(easy_.get(), CURLINFO_RESPONSE_CODE, &status);
    response_.status = static_cast<int>(status);
    if (status >= 200 && status < 300) return Status::Ok();
    while (!finished_) PARSYN_RETURN_IF_ERROR(Drive());  // the error document
    response_.body.assign(pending_.data() + read_offset_,
                          std::min<size_t>(pending_.size() - read_offset_, options_.max_error_body_bytes));
    return Status::Ok();
  }

  const Response& response() const override { return response_; }

  StatusOr<size_t> Read(std::span<std::byte> buffer) override {
    if (response_.status < 200 || response_.status >= 300) return size_t{0};
    while (read_offset_ == pending_.size()) {
      if (finished_) {
        PARSYN_RETURN_IF_ERROR(transfer_status_);
        return size_t{0};
      }
      if (paused_) {
        paused_ = false;
        last_progress_ = std::chrono::steady_clock::now();  // the wait was ours, not the server's
        pending_.clear();
        read_offset_ = 0;
        curl_easy_pause(easy_.get(), CURLPAUSE_CONT);  // may deliver the held data at once
        continue;
      }
      PARSYN_RETURN_IF_ERROR(Drive());
    }
    size_t n = std::min(buffer.size(), pending_.size() - read_offset_);
    std::memcpy(buffer.data(), pending_.data() + read_offset_, n);
    read_offset_ += n;
    return n;
  }

 private:
  static constexpr size_t kMaxPending = size_t{1} << 20;

  static size_t OnHeader(char* data, size_t size, size_t count, void* user) {
    auto* self = static_cast<PulledResponse*>(user);
    self->last_progress_ = std::chrono::steady_clock::now();
    std::string_view line(data, size * count);
    if (line.starts_with("HTTP/")) {
      self->interim_ = line.size() > 9 && line.substr(9, 1) == "1";  // "HTTP/1.1 100 Continue"
    } else if (line == "\r\n" || line == "\n") {
      if (!self->interim_) self->headers_done_ = true;
    }
    CollectHeader(line, self->response_.headers);
    return size * count;
  }

  static size_t OnBody(char* data, size_t size, size_t count, void* user) {
    auto* self = static_cast<PulledResponse*>(user);
    size_t n = size * count;
    if (self->pending_.size() - self->read_offset_ >= kMaxPending) {
      self->paused_ = true;
      return CURL_WRITEFUNC_PAUSE;  // libcurl keeps these bytes and delivers them again on unpause
    }
    self->last_progress_ = std::chrono::steady_clock::now();
    if (self->read_offset_ == self->pending_.size()) {
      self->pending_.clear();
      self->read_offset_ = 0;
    }
    self->pending_.insert(self->pending_.end(), data, data + n);
    return n;
  }

  Status Failure(const TransferFailure& failure) const {
    return options_.describe_failure ? options_.describe_failure(what_, failure)
                                     : DescribeFailure(what_, failure, options_.unreachable_hint);
  }

  // One step of the transfer: lets libcurl move bytes, then waits (at most 1 s) for the socket if there was nothing
  // to hand out. Fails the stream once the server has sent nothing for `stall_timeout` (time we were paused excluded).
  Status Drive() {
    int running = 0;
    CURLMcode mc = curl_multi_perform(multi_.get(), &running);
    if (mc != CURLM_OK) return InternalError(std::string("curl_multi_perform: ") + curl_multi_strerror(mc));
    int queued = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_.get(), &queued)) {
      if (msg->msg == CURLMSG_DONE) {
        finished_ = true;
        if (msg->data.result != CURLE_OK) {
          long os_errno = 0;
          curl_easy_getinfo(easy_.get(), CURLINFO_OS_ERRNO, &os_errno);
          transfer_status_ = Failure(FailureOf(msg->data.result, error_buffer_, os_errno));
        }
      }
    }
    if (finished_ || running == 0 || paused_ || (headers_done_ && read_offset_ < pending_.size())) {
      if (running == 0) finished_ = true;
      return Status::Ok();
    }
    // Returns on socket activity, on libcurl's own timers, or after at most a second.
    mc = curl_multi_poll(multi_.get(), nullptr, 0, 1000, nullptr);
    if (mc != CURLM_OK) return InternalError(std::string("curl_multi_poll: ") + curl_multi_strerror(mc));
    if (options_.stall_timeout.count() > 0 &&
        std::chrono::steady_clock::now() - last_progress_ > options_.stall_timeout) {
      finished_ = true;
      const auto stall_seconds = std::chrono::duration_cast<std::chrono::seconds>(options_.stall_timeout).count();
      transfer_status_ =
          Failure({TransferFailure::Kind::kStalled, "sent nothing for " + std::to_string(stall_seconds) + " s"});
    }
    return Status::Ok();
  }

  TransportOptions options_;  // a copy: a stream may outlive its transport
  std::string what_;
  std::string url_;
  HeaderList headers_;
  // Declared so that the easy handle is destroyed before the multi handle it was added to.
  MultiHandle multi_;
  EasyHandle easy_;
  char error_buffer_[CURL_ERROR_SIZE] = {};
  Response response_;
  std::vector<char> pending_;
  size_t read_offset_ = 0;
  bool interim_ = false;
  bool headers_done_ = false;
  bool paused_ = false;
  bool finished_ = false;
  Status transfer_status_;
  std::chrono::steady_clock::time_point last_progress_ = std::chrono::steady_clock::now();
};

// Sets an attempt's time limits and the callbacks that feed `a` (body, headers, progress) on `curl`.
void SetAttemptCallbacks(CURL* curl, const TransportOptions& options, const Request& request, Attempt& a) {
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout.count()));
  if (options.stall_timeout.count() > 0) {
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                     static_cast<long>(std::max<int64_t>(1, options.stall_timeout.count() / 1000)));
  }
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Attempt::OnWrite);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &a);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &Attempt::OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &a);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &Attempt::OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &a);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
}

// Sets the request's verb on `curl`, and with a body, the upload that streams it from `a`.
void SetMethod(CURL* curl, const Request& request, Attempt& a) {
  if (request.body) {
    // UPLOAD streams the body through OnRead; CUSTOMREQUEST sets the verb (curl would say PUT).
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, &Attempt::OnRead);
    curl_easy_setopt(curl, CURLOPT_READDATA, &a);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body->size()));
  } else if (request.method == "GET") {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  } else if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, 0L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "");
  } else {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
}

}  // namespace

std::string WithoutQuery(std::string_view url) {
  const size_t q = url.find('?');
  return q == std::string_view::npos ? std::string(url) : std::string(url.substr(0, q)) + "?…";
}

std::unique_ptr<RequestBody> MemoryBody(std::string_view bytes) { return std::make_unique<MemoryRequestBody>(bytes); }

std::unique_ptr<RequestBody> FileBody(std::filesystem::path file, uint64_t offset, std::optional<uint64_t> length) {
  return std::make_unique<FileRangeBody>(std::move(file), offset, length);
}

Status DescribeFailure(std::string_view what, const TransferFailure& failure, std::string_view unreachable_hint) {
  const std::string hint = unreachable_hint.empty() ? "" : " (" + std::string(unreachable_hint) + ")";
  const std::string prefix(what);
  switch (failure.kind) {
    case TransferFailure::Kind::kRefused: return UnavailableError(prefix + ": connection refused" + hint);
    case TransferFailure::Kind::kCannotConnect:
      return UnavailableError(prefix + ": cannot connect: " + failure.reason + hint);
    case TransferFailure::Kind::kCannotResolve:
      return UnavailableError(prefix + ": cannot resolve host: " + failure.reason + hint);
    case TransferFailure::Kind::kTimedOut: return DeadlineExceededError(prefix + ": timed out: " + failure.reason);
    case TransferFailure::Kind::kStalled: return UnavailableError(prefix + ": " + failure.reason);
    case TransferFailure::Kind::kOther: return UnavailableError(prefix + ": " + failure.reason);
  }
  return UnavailableError(prefix + ": " + failure.reason);
}

// Idle easy handles; a handle keeps its connection cache across calls.
struct Transport::Pool {
  std::mutex mu;
  std::vector<EasyHandle> idle;

  EasyHandle Take() {
    {
      std::lock_guard lock(mu);
      if (!idle.empty()) {
        EasyHandle h = std::move(idle.back());
        idle.pop_back();
        return h;
      }
    }
    return EasyHandle(curl_easy_init());
  }
  void Give(EasyHandle h) {
    curl_easy_reset(h.get());  // clears options, keeps the connection cache
    std::lock_guard lock(mu);
    idle.push_back(std::move(h));
  }
};

Transport::Transport(TransportOptions options) : options_(std::move(options)), pool_(std::make_unique<Pool>()) {
  InitCurlOnce();
}

Transport::~Transport() = default;

StatusOr<Response> Transport::Perform(const Request& request) {
  const std::string what = What(request);
  const int attempts = request.retry ? std::max(1, options_.max_attempts) : 1;
  std::chrono::milliseconds backoff = options_.backoff_initial;
  thread_local std::minstd_rand jitter(std::random_device{}());
  const HeaderList headers = MakeHeaderList(request.headers);
  auto describe = [&](const TransferFailure& failure) {
    return options_.describe_failure ? options_.describe_failure(what, failure)
                                     : DescribeFailure(what, failure, options_.unreachable_hint);
  };

  for (int attempt = 1;; ++attempt) {
    Attempt a;
    a.request = &request;
    a.options = &options_;
    if (request.body) PARSYN_RETURN_IF_ERROR(request.body->Rewind());
    if (request.sink) PARSYN_RETURN_IF_ERROR(request.sink->Begin());
    EasyHandle handle = pool_->Take();
    if (!handle) return InternalError(what + ": curl_easy_init failed");
    CURL* curl = handle.get();
    a.curl = curl;

    char error_buffer[CURL_ERROR_SIZE];
    SetCommonOptions(curl, options_, request.url, headers.get(), error_buffer);
    SetAttemptCallbacks(curl, options_, request, a);
    SetMethod(curl, request, a);

    const CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    long os_errno = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(curl, CURLINFO_OS_ERRNO, &os_errno);
    // A handle whose transfer failed may hold a broken connection: let it go rather than reuse it.
    if (rc == CURLE_OK) pool_->Give(std::move(handle));
    a.response.status = static_cast<int>(status);
    a.response.attempts = attempt;

    Status failure;
    if (rc != CURLE_OK) {
      if (a.stopped_by_sink) {
        a.response.stopped_by_sink = true;
        return std::move(a.response);
      }
      if (rc == CURLE_ABORTED_BY_CALLBACK && request.stop.stop_requested()) return CancelledError(what + ": cancelled");
      if (!a.body_error.ok()) return a.body_error;
      if (a.too_big) {
        return ResourceExhaustedError(what + ": response exceeds " + std::to_string(request.max_body_bytes) + " bytes");
      }
      failure = describe(FailureOf(rc, error_buffer, os_errno));
      if (!request.retry || !IsRetryableCurlError(rc)) return failure;
    } else if (request.retry && IsRetryableStatus(status) && attempt < attempts) {
      failure = UnavailableError(what + ": HTTP " + std::to_string(status));
    } else {
      a.response.retries_exhausted = attempts > 1 && request.retry && IsRetryableStatus(status);
      return std::move(a.response);
    }

    if (attempt >= attempts) {
      return attempts > 1 ? failure.WithContext("after " + std::to_string(attempts) + " attempts") : failure;
    }
    std::uniform_int_distribution<int64_t> wait(backoff.count() / 2, backoff.count());
    std::chrono::milliseconds pause(wait(jitter));
    PARSYN_LOG_DEBUG("{} (attempt {} of {}); retrying in {} ms", failure.message(), attempt, attempts, pause.count());
    if (!SleepUnlessStopped(pause, request.stop)) return CancelledError(what + ": cancelled");
    backoff = std::min(backoff * 2, options_.backoff_max);
  }
}

StatusOr<std::unique_ptr<ResponseStream>> Transport::Open(const Request& request) {
  auto stream = std::make_unique<PulledResponse>(options_, request);
  PARSYN_RETURN_IF_ERROR(stream->Start(request.method));
  return std::unique_ptr<ResponseStream>(std::move(stream));
}

}  // namespace parsyn::net
