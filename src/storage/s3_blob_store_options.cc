// Where an S3BlobStore's options come from (s3_blob_store.h): the s3:// URI, the environment and the AWS shared
// credentials file; and S3's bucket naming rules, which the URI and S3BlobStore::Create both check.
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "base/strings.h"
#include "storage/s3_blob_store.h"

namespace parsyn::storage {
namespace {

namespace fs = std::filesystem;

std::string PercentDecode(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::strtol(std::string(text.substr(i + 1, 2)).c_str(), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace

bool IsValidS3BucketName(std::string_view bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) return false;
  for (char c : bucket) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) return false;
  }
  return std::isalnum(static_cast<unsigned char>(bucket.front())) &&
         std::isalnum(static_cast<unsigned char>(bucket.back()));
}

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

StatusOr<AwsCredentials> LoadAwsCredentials(const EnvLookup& env, std::string_view profile) {
  auto non_empty = [&](const std::string& name) -> std::optional<std::string> {
    std::optional<std::string> value = env(name);
    if (value && value->empty()) return std::nullopt;
    return value;
  };
  std::optional<std::string> key_id = non_empty("AWS_ACCESS_KEY_ID");
  std::optional<std::string> secret = non_empty("AWS_SECRET_ACCESS_KEY");
  if (key_id && secret) {
    return AwsCredentials{*key_id, *secret, non_empty("AWS_SESSION_TOKEN").value_or("")};
  }
  if (key_id || secret) {
    return InvalidArgumentError("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together");
  }

  std::string profile_name(profile);
  if (profile_name.empty()) profile_name = non_empty("AWS_PROFILE").value_or("default");
  fs::path file;
  if (std::optional<std::string> path = non_empty("AWS_SHARED_CREDENTIALS_FILE")) {
    file = *path;
  } else if (std::optional<std::string> home = non_empty("HOME")) {
    file = fs::path(*home) / ".aws" / "credentials";
  }
  std::ifstream in(file);
  if (file.empty() || !in) {
    return UnauthenticatedError(
        "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or create the shared credentials file " +
        (file.empty() ? std::string("$HOME/.aws/credentials") : file.string()));
  }
  std::map<std::string, std::string> values;
  bool in_profile = false;
  bool found = false;
  std::string line;
  while (std::getline(in, line)) {
    std::string text(Trim(line));
    if (text.empty() || text[0] == '#' || text[0] == ';') continue;
    if (text.front() == '[' && text.back() == ']') {
      in_profile = Trim(std::string_view(text).substr(1, text.size() - 2)) == profile_name;
      found = found || in_profile;
      continue;
    }
    size_t eq = text.find('=');
    if (in_profile && eq != std::string::npos) {
      values[ToLower(Trim(std::string_view(text).substr(0, eq)))] = Trim(std::string_view(text).substr(eq + 1));
    }
  }
  if (!found) {
    return UnauthenticatedError("no AWS credentials: profile '" + profile_name + "' is not in " + file.string() +
                                " and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set");
  }
  if (values["aws_access_key_id"].empty() || values["aws_secret_access_key"].empty()) {
    return InvalidArgumentError("profile '" + profile_name + "' in " + file.string() +
                                " lacks aws_access_key_id or aws_secret_access_key");
  }
  return AwsCredentials{values["aws_access_key_id"], values["aws_secret_access_key"], values["aws_session_token"]};
}

namespace {

// An s3:// URI's error: InvalidArgument saying `why` and what such a URI looks like.
Status BadS3Uri(std::string_view uri, const std::string& why) {
  return InvalidArgumentError("blob store URI '" + std::string(uri) + "': " + why +
                              "; expected s3://BUCKET[/PREFIX][?endpoint=URL&region=R&path_style=0|1&profile=P]");
}

// The options of an s3:// URI's query that ParseS3BlobStoreUri resolves further (defaults from the environment, the
// endpoint checked against the bucket); the part sizes go into the store's options directly.
struct S3UriQuery {
  std::optional<std::string> endpoint, region, path_style, profile;
};

// Parses the query of s3:// URI `uri` (the text after '?'): "name=value" pairs joined by '&', values
// percent-encoded.
StatusOr<S3UriQuery> ParseS3UriQuery(std::string_view uri, std::string_view query, S3BlobStoreOptions& options) {
  S3UriQuery q;
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    size_t eq = pair.find('=');
    std::string name(pair.substr(0, eq));
    std::string value = eq == std::string_view::npos ? "" : PercentDecode(pair.substr(eq + 1));
    if (name == "endpoint")
      q.endpoint = value;
    else if (name == "region")
      q.region = value;
    else if (name == "path_style")
      q.path_style = value;
    else if (name == "profile")
      q.profile = value;
    else if (name == "multipart_threshold_mib" || name == "part_size_mib") {
      uint64_t mib = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), mib);
      const uint64_t least = name == "part_size_mib" ? 5 : 0;  // S3's smallest part but the last is 5 MiB
      if (ec != std::errc() || end != value.data() + value.size() || mib < least || mib > 5 * 1024) {
        return BadS3Uri(uri, name + " must be a whole number of MiB from " + std::to_string(least) + " to 5120");
      }
      (name == "part_size_mib" ? options.part_size_bytes : options.multipart_threshold_bytes) = mib << 20;
    } else {
      return BadS3Uri(uri,
                      "unknown option '" + name +
                          "' (known: endpoint, region, path_style, profile, multipart_threshold_mib, part_size_mib)");
    }
  }
  return q;
}

}  // namespace

StatusOr<S3BlobStoreOptions> ParseS3BlobStoreUri(std::string_view uri, const EnvLookup& env) {
  auto bad = [&](const std::string& why) { return BadS3Uri(uri, why); };
  if (!uri.starts_with("s3://")) return bad("it does not start with s3://");
  std::string_view rest = uri.substr(5);
  std::string_view query;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  S3BlobStoreOptions options;
  size_t slash = rest.find('/');
  options.bucket = std::string(rest.substr(0, slash));
  if (!IsValidS3BucketName(options.bucket)) {
    return bad("bucket '" + options.bucket + "' is not a valid S3 bucket name (3-63 of a-z 0-9 . -)");
  }
  if (slash != std::string_view::npos) {
    std::string_view prefix = rest.substr(slash + 1);
    while (prefix.ends_with('/')) prefix.remove_suffix(1);
    if (!prefix.empty()) {
      if (Status s = ValidateBlobKey(prefix); !s.ok()) return bad("prefix: " + s.message());
      options.prefix = std::string(prefix) + "/";
    }
  }

  PARSYN_ASSIGN_OR_RETURN(S3UriQuery query_options, ParseS3UriQuery(uri, query, options));
  auto& [endpoint, region, path_style, profile] = query_options;

  if (!region || region->empty()) region = env("AWS_REGION");
  if (!region || region->empty()) region = env("AWS_DEFAULT_REGION");
  options.endpoint.region = region && !region->empty() ? *region : "us-east-1";
  if (endpoint) {
    size_t sep = endpoint->find("://");
    std::string scheme = sep == std::string::npos ? "" : endpoint->substr(0, sep);
    std::string host = sep == std::string::npos ? "" : endpoint->substr(sep + 3);
    while (host.ends_with('/')) host.pop_back();
    if ((scheme != "http" && scheme != "https") || host.empty() || host.find('/') != std::string::npos) {
      return bad("endpoint '" + *endpoint + "' must be http(s)://HOST[:PORT] with no path");
    }
    options.endpoint.scheme = scheme;
    options.endpoint.host = host;
    options.endpoint.path_style = true;
  } else {
    options.endpoint.scheme = "https";
    options.endpoint.host = "s3." + options.endpoint.region + ".amazonaws.com";
    options.endpoint.path_style = false;
  }
  if (path_style) {
    if (*path_style != "0" && *path_style != "1") return bad("path_style must be 0 or 1");
    options.endpoint.path_style = *path_style == "1";
  }
  if (!options.endpoint.path_style && options.bucket.find('.') != std::string::npos &&
      options.endpoint.scheme == "https") {
    return bad("bucket names with dots break TLS with virtual-host addressing; add path_style=1");
  }
  PARSYN_ASSIGN_OR_RETURN(options.credentials, LoadAwsCredentials(env, profile.value_or("")));
  return options;
}

}  // namespace parsyn::storage
