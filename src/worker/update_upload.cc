#include "worker/update_upload.h"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/log.h"

namespace parsyn::worker {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kDefaultContentType = "application/octet-stream";

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
  });
}

// One PUT's target: the URL and the headers it was signed with.
struct SignedPut {
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;  // without Content-Type, which goes in content_type
  std::string content_type = kDefaultContentType;
  bool create_only = false;  // carries If-None-Match: *
};

SignedPut ToSignedPut(const std::string& url, const protocol::HttpHeaders& headers) {
  SignedPut put{.url = url};
  for (const auto& [name, value] : headers) {
    if (EqualsIgnoringCase(name, "Content-Type")) {
      put.content_type = value;  // signed: sent as given, instead of the default
      continue;
    }
    if (EqualsIgnoringCase(name, "If-None-Match") && value == "*") put.create_only = true;
    put.headers.emplace_back(name, value);
  }
  return put;
}

bool IsTransient(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded ||
         s.code() == StatusCode::kInternal;
}

// True when the PUT failed only because an earlier attempt already stored the key (see the header).
bool AlreadyStored(const Status& s, const SignedPut& put) {
  return s.code() == StatusCode::kAlreadyExists || (put.create_only && s.code() == StatusCode::kFailedPrecondition);
}

Status UploadSingle(http::Client& client, const SignedPut& put, const fs::path& file, const std::string& sha256,
                    std::stop_token stop) {
  http::CallOptions call{.headers = put.headers, .stop = stop};
  StatusOr<http::ClientResponse> response =
      client.UploadFile(http::Method::kPut, put.url, file, put.content_type, call);
  if (!response.ok()) {
    if (!AlreadyStored(response.status(), put)) return response.status();
    PARSYN_LOG_INFO("worker: the update was already stored by an earlier attempt ({})", response.status().message());
    return Status::Ok();
  }
  // The coordinator answers with what it stored; S3 answers 200 with an empty body.
  StatusOr<json> stored = response->Json();
  if (stored.ok() && stored->is_object() && stored->contains("sha256") && (*stored)["sha256"].is_string() &&
      !sha256.empty() && (*stored)["sha256"].get<std::string>() != sha256) {
    return DataLossError("the coordinator stored the update with sha256 " + (*stored)["sha256"].get<std::string>() +
                         ", the trainer wrote " + sha256);
  }
  return Status::Ok();
}

Status UploadPart(http::Client& client, const SignedPut& put, int number, const fs::path& file, uint64_t offset,
                  uint64_t length, std::stop_token stop, const UploadUpdateOptions& options) {
  std::chrono::milliseconds backoff = options.part_backoff;
  const int attempts = std::max(1, options.part_attempts);
  for (int attempt = 1;; ++attempt) {
    http::CallOptions call{.headers = put.headers, .stop = stop};
    StatusOr<http::ClientResponse> response =
        client.UploadFileRange(http::Method::kPut, put.url, file, offset, length, put.content_type, call);
    if (response.ok()) return Status::Ok();
    const Status failed = response.status().WithContext("part " + std::to_string(number));
    if (!IsTransient(failed) || attempt >= attempts) return failed;
    PARSYN_LOG_WARN("worker: uploading the update: {} (attempt {} of {}); retrying this part", failed.message(),
                    attempt, attempts);
    if (!SleepUnlessStopped(backoff, stop)) return CancelledError("uploading the update: cancelled");
    backoff *= 2;
  }
}

Status UploadMultipart(http::Client& client, const protocol::UpdateUpload::Multipart& multipart, const fs::path& file,
                       uint64_t size, std::stop_token stop, const UploadUpdateOptions& options) {
  const std::string where = "update_upload.multipart";
  const uint64_t part_size = multipart.part_size_bytes;
  if (part_size == 0) return InvalidArgumentError(where + ".part_size_bytes must be positive");
  // An empty file is still one (empty) part: S3 cannot complete an upload without parts.
  const uint64_t needed = std::max<uint64_t>(1, (size + part_size - 1) / part_size);
  if (needed > multipart.parts.size()) {
    return InvalidArgumentError("the update has " + std::to_string(size) + " bytes, which need " +
                                std::to_string(needed) + " parts of " + std::to_string(part_size) +
                                " bytes; the task lists " + std::to_string(multipart.parts.size()));
  }
  for (uint64_t i = 0; i < needed; ++i) {
    const int number = static_cast<int>(i + 1);
    const protocol::UploadPart& part = multipart.parts[i];
    if (part.part_number != number) {
      return InvalidArgumentError(where + ".parts[" + std::to_string(i) + "] has part_number " +
                                  std::to_string(part.part_number) + ", expected " + std::to_string(number));
    }
    const uint64_t offset = i * part_size;
    const uint64_t length = std::min(part_size, size - offset);
    PARSYN_RETURN_IF_ERROR(
        UploadPart(client, ToSignedPut(part.url, part.headers), number, file, offset, length, stop, options));
    PARSYN_LOG_DEBUG("worker: update part {} of {} sent ({} bytes)", number, needed, length);
  }
  return Status::Ok();
}

}  // namespace

Status UploadUpdate(http::Client& blob_client, const protocol::UpdateUpload& upload, const fs::path& file,
                    const std::string& sha256, std::stop_token stop, const UploadUpdateOptions& options) {
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (ec) return NotFoundError("cannot read the update " + file.string() + ": " + ec.message());
  if (upload.max_size_bytes > 0 && size > upload.max_size_bytes) {
    return InvalidArgumentError("the update has " + std::to_string(size) + " bytes, more than the task's limit of " +
                                std::to_string(upload.max_size_bytes));
  }
  if (upload.multipart) return UploadMultipart(blob_client, *upload.multipart, file, size, stop, options);
  if (upload.url.empty()) return InvalidArgumentError("update_upload has neither a url nor multipart parts");
  return UploadSingle(blob_client, ToSignedPut(upload.url, upload.headers.value_or(protocol::HttpHeaders{})), file,
                      sha256, stop);
}

}  // namespace parsyn::worker
