#include "http/client.h"

#include <curl/curl.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>

#include "base/log.h"

namespace parsyn::http {

namespace {

constexpr uint64_t kMaxErrorBodyBytes = 64 << 10;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

struct SlistFree {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

bool IsIdempotent(Method m) {
  return m == Method::kGet || m == Method::kHead || m == Method::kPut || m == Method::kDelete || m == Method::kOptions;
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

StatusCode CodeForHttpStatus(int status) {
  switch (status) {
    case 400: return StatusCode::kInvalidArgument;
    case 401: return StatusCode::kUnauthenticated;
    case 403: return StatusCode::kPermissionDenied;
    case 404: return StatusCode::kNotFound;
    case 409: return StatusCode::kFailedPrecondition;
    case 412: return StatusCode::kFailedPrecondition;  // a conditional header (If-None-Match, If-Match) did not hold
    case 413: return StatusCode::kResourceExhausted;
    case 429: return StatusCode::kResourceExhausted;
    case 499: return StatusCode::kCancelled;
    case 502:
    case 503: return StatusCode::kUnavailable;
    case 504: return StatusCode::kDeadlineExceeded;
    default: return status >= 500 ? StatusCode::kInternal : StatusCode::kInvalidArgument;
  }
}

std::optional<StatusCode> CodeForSlug(std::string_view slug) {
  for (int c = static_cast<int>(StatusCode::kOk) + 1; c <= static_cast<int>(StatusCode::kCancelled); ++c) {
    if (StatusCodeSlug(static_cast<StatusCode>(c)) == slug) return static_cast<StatusCode>(c);
  }
  return std::nullopt;
}

// Incremental text/event-stream parser (the WHATWG rules that matter here: fields, comments, blank-line dispatch).
class SseParser {
 public:
  // Feeds bytes; calls `on_event` per complete event. Returns false as soon as on_event does.
  bool Feed(std::string_view bytes, const std::function<bool(const SseEvent&)>& on_event) {
    pending_.append(bytes);
    size_t start = 0;
    while (true) {
      size_t nl = pending_.find('\n', start);
      if (nl == std::string::npos) break;
      std::string_view line(pending_.data() + start, nl - start);
      start = nl + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) {
        if (has_data_) {
          bool go_on = on_event(event_);
          event_ = SseEvent();
          has_data_ = false;
          if (!go_on) return false;
        }
        event_.event = "message";
        continue;
      }
      if (line.front() == ':') continue;  // comment (keep-alive)
      size_t colon = line.find(':');
      std::string_view field = line.substr(0, colon);
      std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      if (field == "data") {
        if (has_data_) event_.data += '\n';
        event_.data.append(value);
        has_data_ = true;
      } else if (field == "event") {
        event_.event = std::string(value);
      } else if (field == "id") {
        event_.id = std::string(value);
      }
    }
    pending_.erase(0, start);
    return true;
  }

 private:
  std::string pending_;
  SseEvent event_;
  bool has_data_ = false;
};

}  // namespace

// One attempt: where the request body comes from and where the response goes.
struct Client::Transfer {
  // Request body: in memory, or read from a file.
  std::string_view body;
  size_t body_offset = 0;
  std::FILE* upload = nullptr;
  uint64_t upload_size = 0;
  uint64_t upload_left = 0;  // bytes of the file still to send (a range ends before the file does)
  bool has_body = false;
  std::string content_type;
  // Response sinks: memory (default), a file, or an event callback.
  std::FILE* download = nullptr;
  const std::function<bool(const SseEvent&)>* on_event = nullptr;
  bool streaming = false;  // no total timeout unless the call sets one

  // Filled in while the transfer runs.
  CURL* curl = nullptr;
  uint64_t max_body = 0;
  ClientResponse response;
  SseParser sse;
  bool too_big = false;
  bool write_failed = false;
  bool stopped_by_callback = false;
  std::stop_token stop;

  bool Success() const {
    long code = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    return code >= 200 && code < 300;
  }

  static size_t OnWrite(char* data, size_t size, size_t count, void* self_ptr) {
    auto& t = *static_cast<Transfer*>(self_ptr);
    size_t n = size * count;
    std::string_view bytes(data, n);
    if (!t.Success() || (!t.download && !t.on_event)) {
      // Error bodies are kept (they carry the message) but bounded.
      uint64_t cap = t.Success() ? t.max_body : kMaxErrorBodyBytes;
      if (t.response.body.size() + n > cap) {
        t.too_big = t.Success();
        if (!t.too_big) return n;  // keep the head of an error body, drop the rest
        return 0;
      }
      t.response.body.append(bytes);
      return n;
    }
    if (t.download) {
      if (std::fwrite(data, 1, n, t.download) != n) {
        t.write_failed = true;
        return 0;
      }
      return n;
    }
    if (!t.sse.Feed(bytes, *t.on_event)) {
      t.stopped_by_callback = true;
      return 0;
    }
    return n;
  }

  static size_t OnRead(char* buffer, size_t size, size_t count, void* self_ptr) {
    auto& t = *static_cast<Transfer*>(self_ptr);
    size_t room = size * count;
    if (t.upload) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(room, t.upload_left));
      if (want == 0) return 0;
      size_t n = std::fread(buffer, 1, want, t.upload);
      // A file that shrank under us would make curl wait for bytes that never come: abort instead.
      if (n == 0) return CURL_READFUNC_ABORT;
      t.upload_left -= n;
      return n;
    }
    size_t n = std::min(room, t.body.size() - t.body_offset);
    std::memcpy(buffer, t.body.data() + t.body_offset, n);
    t.body_offset += n;
    return n;
  }

  static size_t OnHeader(char* data, size_t size, size_t count, void* self_ptr) {
    auto& t = *static_cast<Transfer*>(self_ptr);
    std::string_view line(data, size * count);
    if (line.starts_with("HTTP/")) {
      t.response.headers.clear();  // a new response (after 100 Continue or a redirect) starts
    } else if (size_t colon = line.find(':'); colon != std::string_view::npos) {
      t.response.headers[Lower(Trim(line.substr(0, colon)))] = std::string(Trim(line.substr(colon + 1)));
    }
    return size * count;
  }

  static int OnProgress(void* self_ptr, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    auto& t = *static_cast<Transfer*>(self_ptr);
    return t.stop.stop_requested() ? 1 : 0;
  }
};

struct Client::Pool {
  std::mutex mu;
  std::vector<CURL*> idle;

  ~Pool() {
    for (CURL* h : idle) curl_easy_cleanup(h);
  }
  CURL* Take() {
    {
      std::lock_guard lock(mu);
      if (!idle.empty()) {
        CURL* h = idle.back();
        idle.pop_back();
        curl_easy_reset(h);  // clears options, keeps the connection cache
        return h;
      }
    }
    return curl_easy_init();
  }
  void Give(CURL* h) {
    std::lock_guard lock(mu);
    idle.push_back(h);
  }
};

StatusOr<nlohmann::json> ClientResponse::Json() const {
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    return InvalidArgumentError(std::string("response is not valid JSON: ") + e.what());
  }
}

Client::Client(ClientOptions options) : options_(std::move(options)), pool_(std::make_unique<Pool>()) {
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  while (!options_.base_url.empty() && options_.base_url.back() == '/') options_.base_url.pop_back();
}

Client::~Client() = default;

std::string Client::Url(std::string_view path) const {
  if (path.starts_with("http://") || path.starts_with("https://")) return std::string(path);
  return options_.base_url + std::string(path);
}

namespace {

std::string WithoutQuery(const std::string& url) {
  const size_t q = url.find('?');
  return q == std::string::npos ? url : url.substr(0, q) + "?…";
}

Status TransportError(std::string_view what, CURLcode rc, const char* error_buffer, long os_errno,
                      const ClientOptions& options) {
  std::string reason = error_buffer[0] ? error_buffer : curl_easy_strerror(rc);
  std::string hint = options.unreachable_hint.empty() ? "" : " (" + options.unreachable_hint + ")";
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
      if (os_errno == ECONNREFUSED) return UnavailableError(std::string(what) + ": connection refused" + hint);
      return UnavailableError(std::string(what) + ": cannot connect: " + reason + hint);
    case CURLE_COULDNT_RESOLVE_HOST:
      return UnavailableError(std::string(what) + ": cannot resolve host: " + reason + hint);
    case CURLE_OPERATION_TIMEDOUT: return DeadlineExceededError(std::string(what) + ": timed out: " + reason);
    default: return UnavailableError(std::string(what) + ": " + reason);
  }
}

Status HttpError(std::string_view what, const ClientResponse& response) {
  StatusCode code = CodeForHttpStatus(response.status);
  std::string message;
  try {
    nlohmann::json body = nlohmann::json::parse(response.body);
    const nlohmann::json& error = body.at("error");
    if (auto slug = CodeForSlug(error.at("code").get<std::string>())) code = *slug;
    message = error.at("message").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    message = response.body.substr(0, 200);  // not our error body: show its head
  }
  std::string text = std::string(what) + ": HTTP " + std::to_string(response.status);
  if (!message.empty()) text += ": " + message;
  return Status(code, std::move(text));
}

}  // namespace

StatusOr<ClientResponse> Client::Execute(Method method, std::string_view path, const CallOptions& call,
                                         const std::function<Status(Transfer&)>& setup) {
  const std::string url = Url(path);
  // Messages name the URL without its query: presigned and signed URLs carry their credential there.
  const std::string what = std::string(MethodName(method)) + " " + WithoutQuery(url);
  const bool retry = call.retry.value_or(IsIdempotent(method));
  const int attempts = retry ? std::max(1, options_.max_attempts) : 1;
  std::chrono::milliseconds backoff = options_.backoff_initial;
  thread_local std::minstd_rand jitter(std::random_device{}());

  for (int attempt = 1;; ++attempt) {
    Transfer t;
    t.stop = call.stop;
    t.max_body = options_.max_response_bytes;
    PARSYN_RETURN_IF_ERROR(setup(t));
    CURL* curl = pool_->Take();
    if (!curl) return InternalError(what + ": curl_easy_init failed");
    t.curl = curl;

    std::unique_ptr<curl_slist, SlistFree> headers;
    auto add_header = [&](const std::string& line) {
      headers.reset(curl_slist_append(headers.release(), line.c_str()));
    };
    if (!options_.bearer_token.empty()) add_header("Authorization: Bearer " + options_.bearer_token);
    if (!t.content_type.empty()) add_header("Content-Type: " + t.content_type);
    for (const auto& [name, value] : call.headers) add_header(name + ": " + value);

    char error_buffer[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout.count()));
    std::chrono::milliseconds timeout =
        call.timeout.value_or(t.streaming ? std::chrono::milliseconds(0) : options_.timeout);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
    if (options_.stall_timeout.count() > 0) {
      curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
      curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                       static_cast<long>(std::max<int64_t>(1, options_.stall_timeout.count() / 1000)));
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Transfer::OnWrite);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &Transfer::OnHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &Transfer::OnProgress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    if (!options_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());

    std::string method_name(MethodName(method));
    if (t.has_body) {
      // UPLOAD streams the body through OnRead; CUSTOMREQUEST sets the verb (curl would say PUT).
      curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method_name.c_str());
      curl_easy_setopt(curl, CURLOPT_READFUNCTION, &Transfer::OnRead);
      curl_easy_setopt(curl, CURLOPT_READDATA, &t);
      curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE,
                       static_cast<curl_off_t>(t.upload ? t.upload_size : t.body.size()));
    } else if (method == Method::kGet) {
      curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    } else if (method == Method::kHead) {
      curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else if (method == Method::kPost) {
      curl_easy_setopt(curl, CURLOPT_POST, 1L);
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, 0L);
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "");
    } else {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method_name.c_str());
    }

    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    long os_errno = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(curl, CURLINFO_OS_ERRNO, &os_errno);
    pool_->Give(curl);
    t.response.status = static_cast<int>(status);

    Status failure;
    if (rc != CURLE_OK) {
      if (t.stopped_by_callback) return std::move(t.response);
      if (rc == CURLE_ABORTED_BY_CALLBACK && t.stop.stop_requested()) return CancelledError(what + ": cancelled");
      if (t.write_failed) return InternalError(what + ": writing the response to disk failed: " + std::strerror(errno));
      if (t.too_big) {
        return ResourceExhaustedError(what + ": response exceeds " + std::to_string(t.max_body) + " bytes");
      }
      failure = TransportError(what, rc, error_buffer, os_errno, options_);
      if (!retry || !IsRetryableCurlError(rc)) return failure;
    } else if (status == 502 || status == 503 || status == 504) {
      failure = HttpError(what, t.response);
    } else if (status < 200 || status >= 300) {
      return HttpError(what, t.response);
    } else {
      return std::move(t.response);
    }

    if (attempt >= attempts) {
      return attempts > 1 ? failure.WithContext("after " + std::to_string(attempts) + " attempts") : failure;
    }
    std::uniform_int_distribution<int64_t> wait(backoff.count() / 2, backoff.count());
    std::chrono::milliseconds pause(wait(jitter));
    PARSYN_LOG_DEBUG("http: {} (attempt {} of {}); retrying in {} ms", failure.message(), attempt, attempts,
                     pause.count());
    std::mutex mu;
    std::condition_variable_any cv;
    std::unique_lock lock(mu);
    if (cv.wait_for(lock, call.stop, pause, [] { return false; }) || call.stop.stop_requested()) {
      return CancelledError(what + ": cancelled");
    }
    backoff = std::min(backoff * 2, options_.backoff_max);
  }
}

StatusOr<ClientResponse> Client::Get(std::string_view path, CallOptions call) {
  return Execute(Method::kGet, path, call, [](Transfer&) { return Status::Ok(); });
}

StatusOr<ClientResponse> Client::Delete(std::string_view path, CallOptions call) {
  return Execute(Method::kDelete, path, call, [](Transfer&) { return Status::Ok(); });
}

StatusOr<ClientResponse> Client::PostJson(std::string_view path, const nlohmann::json& body, CallOptions call) {
  return Send(Method::kPost, path, body.dump(), "application/json", std::move(call));
}

StatusOr<ClientResponse> Client::PutJson(std::string_view path, const nlohmann::json& body, CallOptions call) {
  return Send(Method::kPut, path, body.dump(), "application/json", std::move(call));
}

StatusOr<ClientResponse> Client::Send(Method method, std::string_view path, std::string body, std::string content_type,
                                      CallOptions call) {
  return Execute(method, path, call, [&](Transfer& t) {
    t.body = body;
    t.has_body = !body.empty() || method == Method::kPost || method == Method::kPut || method == Method::kPatch;
    t.content_type = content_type;
    return Status::Ok();
  });
}

StatusOr<ClientResponse> Client::UploadFile(Method method, std::string_view path, const std::filesystem::path& file,
                                            std::string content_type, CallOptions call) {
  File in;
  return Execute(method, path, call, [&](Transfer& t) -> Status {
    in.reset(std::fopen(file.c_str(), "rb"));  // reopened per attempt, so a retry starts from byte 0
    if (!in) return NotFoundError("cannot open '" + file.string() + "' for upload: " + std::strerror(errno));
    std::error_code ec;
    t.upload_size = std::filesystem::file_size(file, ec);
    if (ec) return NotFoundError("cannot stat '" + file.string() + "': " + ec.message());
    t.upload = in.get();
    t.upload_left = t.upload_size;
    t.has_body = true;
    t.streaming = true;
    t.content_type = content_type;
    return Status::Ok();
  });
}

StatusOr<ClientResponse> Client::UploadFileRange(Method method, std::string_view path,
                                                 const std::filesystem::path& file, uint64_t offset, uint64_t length,
                                                 std::string content_type, CallOptions call) {
  File in;
  return Execute(method, path, call, [&](Transfer& t) -> Status {
    in.reset(std::fopen(file.c_str(), "rb"));  // reopened per attempt, so a retry starts again from `offset`
    if (!in) return NotFoundError("cannot open '" + file.string() + "' for upload: " + std::strerror(errno));
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(file, ec);
    if (ec) return NotFoundError("cannot stat '" + file.string() + "': " + ec.message());
    if (offset > size || length > size - offset) {
      return InvalidArgumentError("bytes " + std::to_string(offset) + "+" + std::to_string(length) +
                                  " lie beyond the " + std::to_string(size) + " bytes of '" + file.string() + "'");
    }
    if (::fseeko(in.get(), static_cast<off_t>(offset), SEEK_SET) != 0) {
      return InternalError("cannot seek in '" + file.string() + "': " + std::strerror(errno));
    }
    t.upload = in.get();
    t.upload_size = length;
    t.upload_left = length;
    t.has_body = true;
    t.streaming = true;
    t.content_type = content_type;
    return Status::Ok();
  });
}

StatusOr<uint64_t> Client::DownloadToFile(std::string_view path, const std::filesystem::path& dest, CallOptions call) {
  std::filesystem::path part = dest;
  part += ".part";
  File out;
  StatusOr<ClientResponse> response = Execute(Method::kGet, path, call, [&](Transfer& t) -> Status {
    out.reset(std::fopen(part.c_str(), "wb"));  // truncated per attempt
    if (!out) return InternalError("cannot create '" + part.string() + "': " + std::strerror(errno));
    t.download = out.get();
    t.streaming = true;
    return Status::Ok();
  });
  if (!response.ok()) {
    out.reset();
    std::error_code ignored;
    std::filesystem::remove(part, ignored);  // best effort: a stale .part file is overwritten next time
    return response.status();
  }
  bool flushed = std::fflush(out.get()) == 0;
  out.reset();
  std::error_code ec;
  if (!flushed) ec = std::error_code(errno, std::generic_category());
  if (!ec) std::filesystem::rename(part, dest, ec);
  if (ec) return InternalError("saving download to '" + dest.string() + "': " + ec.message());
  uint64_t size = std::filesystem::file_size(dest, ec);
  if (ec) return InternalError("saving download to '" + dest.string() + "': " + ec.message());
  return size;
}

Status Client::ReadEvents(std::string_view path, const std::function<bool(const SseEvent&)>& on_event,
                          CallOptions call) {
  if (!call.retry) call.retry = false;
  call.headers.emplace_back("Accept", "text/event-stream");
  StatusOr<ClientResponse> response = Execute(Method::kGet, path, call, [&](Transfer& t) {
    t.on_event = &on_event;
    t.streaming = true;
    return Status::Ok();
  });
  return response.status();
}

}  // namespace parsyn::http
