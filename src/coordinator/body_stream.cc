#include "coordinator/body_stream.h"

#include <algorithm>
#include <cstring>

namespace parsyn::coordinator {

StatusOr<size_t> BodyPipe::Read(std::span<std::byte> buffer) {
  bool was_full = false;
  size_t copied = 0;
  {
    std::unique_lock lock(mu_);
    ready_.wait(lock, [&] { return !chunks_.empty() || closed_ || !error_.ok(); });
    if (!error_.ok()) return error_;
    if (chunks_.empty()) return size_t{0};  // closed and drained: the end
    was_full = buffered_bytes_ >= max_buffered_bytes_;
    while (copied < buffer.size() && !chunks_.empty()) {
      const std::string& front = chunks_.front();
      size_t n = std::min(buffer.size() - copied, front.size() - offset_in_front_);
      std::memcpy(buffer.data() + copied, front.data() + offset_in_front_, n);
      copied += n;
      offset_in_front_ += n;
      buffered_bytes_ -= n;
      if (offset_in_front_ == front.size()) {
        chunks_.pop_front();
        offset_in_front_ = 0;
      }
    }
  }
  if (was_full && on_drained_) on_drained_();
  return copied;
}

bool BodyPipe::Push(std::string_view chunk) {
  {
    std::lock_guard lock(mu_);
    if (abandoned_) return false;
    chunks_.emplace_back(chunk);
    buffered_bytes_ += chunk.size();
  }
  ready_.notify_one();
  return true;
}

void BodyPipe::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  ready_.notify_one();
}

void BodyPipe::Fail(Status error) {
  {
    std::lock_guard lock(mu_);
    error_ = std::move(error);
  }
  ready_.notify_one();
}

void BodyPipe::Abandon() {
  std::lock_guard lock(mu_);
  abandoned_ = true;
  chunks_.clear();
  buffered_bytes_ = 0;
}

bool BodyPipe::Full() const {
  std::lock_guard lock(mu_);
  return !abandoned_ && buffered_bytes_ >= max_buffered_bytes_;
}

}  // namespace parsyn::coordinator
