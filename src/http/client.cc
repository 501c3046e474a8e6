#include "http/client.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/json_nesting.h"
#include "http/status_codes.h"
#include "net/transport.h"

namespace parsyn::http {

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

bool IsIdempotent(Method m) {
  return m == Method::kGet || m == Method::kHead || m == Method::kPut || m == Method::kDelete || m == Method::kOptions;
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

// DownloadToFile's sink: the body into a file, truncated at each attempt.
class FileSink final : public net::ResponseSink {
 public:
  FileSink(std::filesystem::path path, std::function<void(uint64_t)> on_transfer)
      : path_(std::move(path)), on_transfer_(std::move(on_transfer)) {}
  Status Begin() override {
    out_.reset(std::fopen(path_.c_str(), "wb"));
    if (!out_) return InternalError("cannot create '" + path_.string() + "': " + std::strerror(errno));
    received_ = 0;
    if (on_transfer_) on_transfer_(0);
    return Status::Ok();
  }
  bool Write(std::string_view bytes) override {
    if (std::fwrite(bytes.data(), 1, bytes.size(), out_.get()) == bytes.size()) {
      received_ += bytes.size();
      if (on_transfer_) on_transfer_(received_);
      return true;
    }
    write_failed_ = true;
    write_errno_ = errno;
    return false;
  }
  std::FILE* file() { return out_.get(); }
  void Close() { out_.reset(); }
  bool write_failed() const { return write_failed_; }
  int write_errno() const { return write_errno_; }

 private:
  std::filesystem::path path_;
  std::function<void(uint64_t)> on_transfer_;
  uint64_t received_ = 0;
  File out_;
  bool write_failed_ = false;
  int write_errno_ = 0;
};

// An upload's body that reports the bytes read from it so far (CallOptions::on_transfer).
class ReportingBody final : public net::RequestBody {
 public:
  ReportingBody(std::unique_ptr<net::RequestBody> body, std::function<void(uint64_t)> on_transfer)
      : body_(std::move(body)), on_transfer_(std::move(on_transfer)) {}
  Status Rewind() override {
    sent_ = 0;
    Status s = body_->Rewind();
    if (s.ok()) on_transfer_(0);
    return s;
  }
  uint64_t size() const override { return body_->size(); }
  StatusOr<size_t> Read(char* out, size_t n) override {
    StatusOr<size_t> read = body_->Read(out, n);
    if (read.ok() && *read > 0) on_transfer_(sent_ += *read);
    return read;
  }

 private:
  std::unique_ptr<net::RequestBody> body_;
  std::function<void(uint64_t)> on_transfer_;
  uint64_t sent_ = 0;
};

// ReadEvents' sink: the body through an SSE parser to the caller's callback.
class EventSink final : public net::ResponseSink {
 public:
  explicit EventSink(const std::function<bool(const SseEvent&)>& on_event) : on_event_(on_event) {}
  Status Begin() override {
    parser_ = SseParser();
    return Status::Ok();
  }
  bool Write(std::string_view bytes) override { return parser_.Feed(bytes, on_event_); }

 private:
  const std::function<bool(const SseEvent&)>& on_event_;
  SseParser parser_;
};

Status HttpError(std::string_view what, const ClientResponse& response) {
  StatusCode code = CodeForHttpStatus(response.status);
  std::string message = response.body.substr(0, 200);  // unless it is our error body: show its head
  try {
    if (CheckJsonNesting(response.body, "response").ok()) {
      nlohmann::json body = nlohmann::json::parse(response.body);
      const nlohmann::json& error = body.at("error");
      if (auto slug = CodeForSlug(error.at("code").get<std::string>())) code = *slug;
      message = error.at("message").get<std::string>();
    }
  } catch (const nlohmann::json::exception&) {
  }
  std::string text = std::string(what) + ": HTTP " + std::to_string(response.status);
  if (!message.empty()) text += ": " + message;
  return Status(code, std::move(text));
}

}  // namespace

StatusOr<nlohmann::json> ClientResponse::Json() const {
  PARSYN_RETURN_IF_ERROR(CheckJsonNesting(body, "response"));
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for numbers such as 1e400
    return InvalidArgumentError(std::string("response is not valid JSON: ") + e.what());
  }
}

Client::Client(ClientOptions options) : options_(std::move(options)) {
  while (!options_.base_url.empty() && options_.base_url.back() == '/') options_.base_url.pop_back();
  net::TransportOptions transport;
  transport.connect_timeout = options_.connect_timeout;
  transport.stall_timeout = options_.stall_timeout;
  transport.max_attempts = options_.max_attempts;
  transport.backoff_initial = options_.backoff_initial;
  transport.backoff_max = options_.backoff_max;
  transport.ca_file = options_.ca_file;
  transport.client_cert_file = options_.client_cert_file;
  transport.client_key_file = options_.client_key_file;
  transport.unreachable_hint = options_.unreachable_hint;
  transport_ = std::make_unique<net::Transport>(std::move(transport));
}

Client::~Client() = default;

std::string Client::Url(std::string_view path) const {
  if (path.starts_with("http://") || path.starts_with("https://")) return std::string(path);
  return options_.base_url + std::string(path);
}

StatusOr<ClientResponse> Client::Execute(Method method, std::string_view path, const CallOptions& call,
                                         net::RequestBody* body, std::string_view content_type, net::ResponseSink* sink,
                                         bool streaming) {
  net::Request request;
  request.method = MethodName(method);
  request.url = Url(path);
  request.body = body;
  request.sink = sink;
  request.max_body_bytes = options_.max_response_bytes;
  request.timeout = call.timeout.value_or(streaming ? std::chrono::milliseconds(0) : options_.timeout);
  request.retry = call.retry.value_or(IsIdempotent(method));
  request.stop = call.stop;
  if (!options_.bearer_token.empty()) request.headers.emplace_back("Authorization", "Bearer " + options_.bearer_token);
  if (!content_type.empty()) request.headers.emplace_back("Content-Type", std::string(content_type));
  for (const auto& header : options_.headers) request.headers.push_back(header);
  for (const auto& header : call.headers) request.headers.push_back(header);

  PARSYN_ASSIGN_OR_RETURN(net::Response response, transport_->Perform(request));
  ClientResponse out;
  out.status = response.status;
  out.body = std::move(response.body);
  out.headers = std::move(response.headers);
  if (!response.stopped_by_sink && (out.status < 200 || out.status >= 300)) {
    // Messages name the URL without its query: presigned and signed URLs carry their credential there.
    Status error = HttpError(request.method + " " + net::WithoutQuery(request.url), out);
    if (response.retries_exhausted)
      error = error.WithContext("after " + std::to_string(response.attempts) + " attempts");
    return error;
  }
  return out;
}

StatusOr<ClientResponse> Client::Get(std::string_view path, CallOptions call) {
  return Execute(Method::kGet, path, call, nullptr, "", nullptr, false);
}

StatusOr<ClientResponse> Client::Delete(std::string_view path, CallOptions call) {
  return Execute(Method::kDelete, path, call, nullptr, "", nullptr, false);
}

StatusOr<ClientResponse> Client::PostJson(std::string_view path, const nlohmann::json& body, CallOptions call) {
  return Send(Method::kPost, path, body.dump(), "application/json", std::move(call));
}

StatusOr<ClientResponse> Client::PutJson(std::string_view path, const nlohmann::json& body, CallOptions call) {
  return Send(Method::kPut, path, body.dump(), "application/json", std::move(call));
}

StatusOr<ClientResponse> Client::Send(Method method, std::string_view path, std::string body, std::string content_type,
                                      CallOptions call) {
  const bool has_body = !body.empty() || method == Method::kPost || method == Method::kPut || method == Method::kPatch;
  std::unique_ptr<net::RequestBody> source = net::MemoryBody(body);
  return Execute(method, path, call, has_body ? source.get() : nullptr, content_type, nullptr, false);
}

StatusOr<ClientResponse> Client::UploadFile(Method method, std::string_view path, const std::filesystem::path& file,
                                            std::string content_type, CallOptions call) {
  std::unique_ptr<net::RequestBody> source = net::FileBody(file);
  if (call.on_transfer) source = std::make_unique<ReportingBody>(std::move(source), call.on_transfer);
  return Execute(method, path, call, source.get(), content_type, nullptr, true);
}

StatusOr<ClientResponse> Client::UploadFileRange(Method method, std::string_view path,
                                                 const std::filesystem::path& file, uint64_t offset, uint64_t length,
                                                 std::string content_type, CallOptions call) {
  std::unique_ptr<net::RequestBody> source = net::FileBody(file, offset, length);
  if (call.on_transfer) source = std::make_unique<ReportingBody>(std::move(source), call.on_transfer);
  return Execute(method, path, call, source.get(), content_type, nullptr, true);
}

StatusOr<uint64_t> Client::DownloadToFile(std::string_view path, const std::filesystem::path& dest, CallOptions call) {
  std::filesystem::path part = dest;
  part += ".part";
  FileSink sink(part, call.on_transfer);
  StatusOr<ClientResponse> response = Execute(Method::kGet, path, call, nullptr, "", &sink, true);
  if (response.ok() && sink.write_failed()) {
    response = InternalError("GET " + net::WithoutQuery(Url(path)) +
                             ": writing the response to disk failed: " + std::strerror(sink.write_errno()));
  }
  if (!response.ok()) {
    sink.Close();
    std::error_code ignored;
    std::filesystem::remove(part, ignored);  // best effort: a stale .part file is overwritten next time
    return response.status();
  }
  bool flushed = std::fflush(sink.file()) == 0;
  sink.Close();
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
  EventSink sink(on_event);
  return Execute(Method::kGet, path, call, nullptr, "", &sink, true).status();
}

}  // namespace parsyn::http
