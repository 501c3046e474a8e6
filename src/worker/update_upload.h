// Uploads a train task's update (the trainer's update.safetensors) through the task's "update_upload", with no
// storage credentials: every URL is signed in its query (the coordinator's /blobs URLs or S3 presigned URLs), so the
// client given here must send no Authorization header (S3 refuses a presigned request that also carries one, and the
// worker's token must not reach the store).
//
// The two forms of protocol::UpdateUpload: one signed PUT to `url` (with `headers`), or S3 parts (`multipart`).
// Listed headers are sent exactly as given (S3 signs them). Multipart: the file goes as max(1, ceil(size / P))
// consecutive parts, part i (from 1) being bytes [(i-1)P, iP) streamed from the file to parts[i-1]; unused listed
// parts are left alone (the coordinator completes the upload with the parts that arrived). Each part is retried on
// its own (the client's retries, then `part_attempts` here for transient failures), so a broken connection costs one
// part, never the parts already sent.
//
// Already stored: a PUT repeated after an attempt that did store the update finds the key taken. The coordinator
// says so with 409 already_exists (AlreadyExists); S3 with 412 PreconditionFailed for a create-only PUT, i.e. one
// whose listed headers carry `If-None-Match: *` (the client's FailedPrecondition; S3's 409 for a concurrent create of
// the same key is FailedPrecondition too). Both count as success: the coordinator verifies size and sha256 of what is
// stored before the update counts.
//
// Errors: InvalidArgument for an upload with neither url nor parts, parts numbered out of order, a file larger than
// max_size_bytes (0: no limit), or one needing more parts than listed; NotFound when the file cannot be read;
// DataLoss when the coordinator reports storing a different sha256 than `sha256`; Cancelled on `stop`; otherwise the
// client's Status for the failed PUT (Unavailable, ...).
// Threads: blocks the caller; the client may be shared.
#pragma once

#include <chrono>
#include <filesystem>
#include <stop_token>
#include <string>

#include "base/status.h"
#include "http/client.h"
#include "protocol/messages.h"

namespace parsyn::worker {

struct UploadUpdateOptions {
  // Attempts per multipart part on Unavailable / DeadlineExceeded / Internal (each already retried by the client).
  int part_attempts = 3;
  std::chrono::milliseconds part_backoff{1'000};  // wait before the second attempt; doubles after each
};

// `sha256`: the trainer's hash of `file`, checked against the coordinator's answer when it gives one ("" skips).
Status UploadUpdate(http::Client& blob_client, const protocol::UpdateUpload& upload, const std::filesystem::path& file,
                    const std::string& sha256, std::stop_token stop, const UploadUpdateOptions& options = {});

}  // namespace parsyn::worker
