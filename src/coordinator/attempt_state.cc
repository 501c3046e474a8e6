#include "coordinator/attempt_state.h"

#include <algorithm>

namespace parsyn::coordinator {

void AttemptState::Begin(const std::vector<int64_t>& participants) {
  started_ = std::chrono::steady_clock::now();
  results_.clear();
  recorded_updates_.clear();
  stored_participants_ = std::set<int64_t>(participants.begin(), participants.end());
  verified_update_bytes_.clear();
  multipart_uploads_.clear();
  progress_.clear();
  last_verdicts_.clear();
  bytes_down_ = 0;
  bytes_up_ = 0;
}

const ResultReport* AttemptState::result(int64_t worker_id) const {
  auto it = results_.find(worker_id);
  return it == results_.end() ? nullptr : &it->second;
}

void AttemptState::RecordVerdict(int64_t worker_id, const Status& verdict) {
  recorded_updates_.insert(worker_id);
  last_verdicts_[worker_id] = verdict.ok() ? "" : verdict.message();
}

const std::string* AttemptState::last_verdict(int64_t worker_id) const {
  auto it = last_verdicts_.find(worker_id);
  return it == last_verdicts_.end() ? nullptr : &it->second;
}

void AttemptState::RecordVerifiedBytes(const std::string& blob_key, uint64_t size_bytes) {
  if (size_bytes > 0) verified_update_bytes_[blob_key] = size_bytes;
}

std::optional<uint64_t> AttemptState::verified_bytes(const std::string& blob_key) const {
  auto it = verified_update_bytes_.find(blob_key);
  if (it == verified_update_bytes_.end()) return std::nullopt;
  return it->second;
}

const MultipartUpload* AttemptState::multipart_upload(int64_t worker_id) const {
  auto it = multipart_uploads_.find(worker_id);
  return it == multipart_uploads_.end() ? nullptr : &it->second;
}

std::optional<MultipartUpload> AttemptState::TakeMultipartUpload(int64_t worker_id, const std::string& key) {
  auto it = multipart_uploads_.find(worker_id);
  if (it == multipart_uploads_.end() || it->second.key != key) return std::nullopt;
  MultipartUpload upload = it->second;
  multipart_uploads_.erase(it);
  return upload;
}

size_t AttemptState::MaxEarlyCheckedUpdates(bool held_as_store_mappings, uint64_t max_update_bytes) {
  if (held_as_store_mappings) return kMaxEarlyCheckedMapped;
  return std::max<size_t>(kMinEarlyCheckedUpdates, kEarlyCheckedBudgetBytes / std::max<uint64_t>(1, max_update_bytes));
}

bool AttemptState::MayCheckEarly(int64_t worker_id, size_t max_checked) const {
  return checked_updates_.size() < max_checked && checked_updates_.count(worker_id) == 0;
}

void AttemptState::StartEarlyCheck(int64_t worker_id, int round, int attempt, const std::string& blob_key) {
  checked_updates_[worker_id] = CheckedUpdate{.round = round, .attempt = attempt, .blob_key = blob_key};
}

void AttemptState::FinishEarlyCheck(int64_t worker_id, StatusOr<weights::WeightSet> update,
                                    std::optional<double> max_magnitude) {
  if (auto c = checked_updates_.find(worker_id); c != checked_updates_.end()) {
    c->second.update = std::move(update);
    c->second.max_magnitude = max_magnitude;
    c->second.ready = true;
  }
}

std::optional<CheckedUpdate> AttemptState::TakeEarlyChecked(int64_t worker_id, int round, int attempt,
                                                            const std::string& blob_key) {
  auto c = checked_updates_.find(worker_id);
  if (c == checked_updates_.end() || !c->second.ready || c->second.round != round || c->second.attempt != attempt ||
      c->second.blob_key != blob_key) {
    return std::nullopt;
  }
  CheckedUpdate checked = std::move(c->second);
  checked_updates_.erase(c);
  return checked;
}

void AttemptState::RememberCheckedUpload(const std::string& blob_key, StreamChecked checked) {
  if (checked_uploads_.size() >= kMaxCheckedUploads) checked_uploads_.erase(checked_uploads_.begin());
  checked_uploads_[blob_key] = std::move(checked);
}

std::optional<StreamChecked> AttemptState::TakeCheckedUpload(const std::string& blob_key) {
  auto it = checked_uploads_.find(blob_key);
  if (it == checked_uploads_.end()) return std::nullopt;
  StreamChecked checked = std::move(it->second);
  checked_uploads_.erase(it);
  return checked;
}

}  // namespace parsyn::coordinator
