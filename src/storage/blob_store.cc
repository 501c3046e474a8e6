#include "storage/blob_store.h"

#include <cstdio>

#include "storage/directory_blob_store.h"
#include "storage/s3_blob_store.h"

namespace parsyn::storage {
namespace {

bool IsKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

// The key as it is safe to print in a message: non-printable bytes escaped, long keys shortened.
std::string Printable(std::string_view key) {
  constexpr size_t kMaxShown = 80;
  std::string out;
  for (size_t i = 0; i < key.size() && i < kMaxShown; ++i) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (key.size() > kMaxShown) out += "...";
  return out;
}

Status BadKey(std::string_view key, std::string_view rule) {
  return InvalidArgumentError("invalid blob key '" + Printable(key) + "': " + std::string(rule));
}

}  // namespace

Status ValidateBlobKey(std::string_view key) {
  if (key.empty()) return BadKey(key, "it is empty");
  if (key.size() > kMaxBlobKeyBytes) {
    return BadKey(
        key, "it is " + std::to_string(key.size()) + " bytes long, the limit is " + std::to_string(kMaxBlobKeyBytes));
  }
  if (key.front() == '/') return BadKey(key, "it starts with '/' (keys are relative)");
  if (key.back() == '/') return BadKey(key, "it ends with '/'");
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    std::string_view segment = key.substr(start, end - start);
    if (segment.empty()) return BadKey(key, "it has an empty segment ('//')");
    bool only_dots = true;
    for (char c : segment) {
      if (!IsKeyChar(c)) {
        return BadKey(key, "it contains '" + Printable(std::string_view(&c, 1)) +
                               "'; keys use only A-Z a-z 0-9 . _ - and '/' between segments");
      }
      only_dots = only_dots && c == '.';
    }
    if (only_dots) return BadKey(key, "segment '" + std::string(segment) + "' is made only of dots");
    start = end + 1;
  }
  return Status::Ok();
}

Status ValidateBlobKeyPrefix(std::string_view prefix) {
  if (prefix.empty()) return Status::Ok();
  if (prefix.front() == '/') return BadKey(prefix, "a prefix cannot start with '/'").WithContext("prefix");
  size_t slash = prefix.rfind('/');
  if (slash != std::string_view::npos) {
    Status dir_ok = ValidateBlobKey(prefix.substr(0, slash));
    if (!dir_ok.ok()) return dir_ok.WithContext("prefix");
  }
  for (char c : prefix.substr(slash == std::string_view::npos ? 0 : slash + 1)) {
    if (!IsKeyChar(c)) {
      return BadKey(prefix, "it contains '" + Printable(std::string_view(&c, 1)) +
                                "'; keys use only A-Z a-z 0-9 . _ - and '/' between segments")
          .WithContext("prefix");
    }
  }
  return Status::Ok();
}

Status BlobStore::DeleteAll(std::span<const std::string> keys) {
  for (const std::string& key : keys) PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  for (const std::string& key : keys) {
    Status deleted = Delete(key);
    if (!deleted.ok() && deleted.code() != StatusCode::kNotFound) return deleted;
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<BlobStore>> OpenBlobStore(std::string_view uri) {
  constexpr std::string_view kSupported =
      "supported: file:///absolute/dir, a plain directory path, or s3://bucket/prefix?options (docs/s3.md)";
  if (uri.empty()) return InvalidArgumentError(std::string("empty blob store URI; ") + std::string(kSupported));
  std::string_view path = uri;
  if (uri.starts_with("file://")) {
    path = uri.substr(7);
    if (!path.starts_with("/")) {
      return InvalidArgumentError("blob store URI '" + std::string(uri) +
                                  "' has a host or a relative path; use file:///absolute/dir");
    }
  } else if (uri.starts_with("s3://")) {
    return OpenS3BlobStore(uri);
  } else if (size_t scheme_end = uri.find("://"); scheme_end != std::string_view::npos) {
    return InvalidArgumentError("blob store URI scheme '" + std::string(uri.substr(0, scheme_end)) +
                                "' is not supported by this build; " + std::string(kSupported));
  }
  PARSYN_ASSIGN_OR_RETURN(auto store, DirectoryBlobStore::Open(std::filesystem::path(path)));
  return std::unique_ptr<BlobStore>(std::move(store));
}

}  // namespace parsyn::storage
