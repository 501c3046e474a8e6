#include "storage/directory_blob_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <system_error>

#include "base/log.h"
#include "base/sha256.h"
#include "storage/disk_full.h"

namespace parsyn::storage {
namespace fs = std::filesystem;
namespace {

// A blob's sha256 (64 hex digits): the extended attribute of its file, or, where the file system has no user
// extended attributes, a sidecar file beside it. Either is a cache: without one, Head hashes the blob again.
constexpr const char* kSha256Xattr = "user.parsyn.sha256";
constexpr std::string_view kSidecarSuffix = "#sha256";
constexpr std::string_view kTempMarker = "#tmp-";
constexpr size_t kChunkBytes = 1 << 20;
// Each write() hands the page cache at most this much. A larger write makes the kernel allocate large folios for it
// (ext4 has them since Linux 6.16), and on a VM whose free memory is handed back to the host (virtio-balloon free page
// reporting) those come from blocks the host has to fault in again: measured on the 2-core Firecracker VM, 100 MiB
// into a new file took 260-650 ms in 1 MiB writes and 25-130 ms in 256 KiB ones (the same bytes, the same kernel).
constexpr size_t kMaxWriteBytes = 256 << 10;

std::string Errno(std::string_view what, const fs::path& path) {
  return std::string(what) + " " + path.string() + ": " + std::strerror(errno);
}

// The error of a failed write (errno set): disk full (disk_full.h) when the file system is out of space, else
// Unavailable saying what failed.
Status WriteError(std::string_view what, const fs::path& path) {
  const int err = errno;
  if (IsDiskFullErrno(err)) return DiskFullError(path.string(), std::string(what) + ": " + std::strerror(err));
  return UnavailableError(Errno(what, path));
}

// Closes the descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error close() returns (on some file systems, the first sign of a failed write).
  int Close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// Removes the file when it goes out of scope unless Release() was called.
class RemoveOnExit {
 public:
  explicit RemoveOnExit(fs::path path) : path_(std::move(path)) {}
  ~RemoveOnExit() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;
  void Release() { path_.clear(); }

 private:
  fs::path path_;
};

Status FsyncPath(const fs::path& path, int flags) {
  Fd fd(::open(path.c_str(), flags | O_CLOEXEC));
  if (fd.get() < 0) return UnavailableError(Errno("opening", path));
  if (::fsync(fd.get()) != 0) return WriteError("fsync of", path);
  return Status::Ok();
}

Status FsyncDir(const fs::path& dir) { return FsyncPath(dir, O_RDONLY | O_DIRECTORY); }

// A name no other writer (thread or process) uses at the same time.
std::string UniqueTempSuffix() {
  static std::atomic<uint64_t> counter{0};
  return std::string(kTempMarker) + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

// Creates the directories of `relative` under `root` one at a time. After each, if sync_parent(dir, created) says so,
// fsyncs its parent (fsync of a file does not make its directory entry durable) and calls synced(dir).
Status EnsureDirs(const fs::path& root, const fs::path& relative,
                  const std::function<bool(const fs::path& dir, bool created)>& sync_parent,
                  const std::function<void(const fs::path& dir)>& synced = {}) {
  fs::path dir = root;
  for (const fs::path& part : relative) {
    fs::path parent = dir;
    dir /= part;
    const bool created = ::mkdir(dir.c_str(), 0755) == 0;
    if (!created && errno != EEXIST && errno != ENOTDIR) {  // ENOTDIR: reported by Put, which knows the key
      return WriteError("creating directory", dir);
    }
    if (sync_parent(dir, created)) {
      PARSYN_RETURN_IF_ERROR(FsyncDir(parent));
      if (synced) synced(dir);
    }
  }
  return Status::Ok();
}

// Writes `contents` to `path` (created exclusively) and, if `durable`, fsyncs it.
Status WriteSmallFile(const fs::path& path, std::string_view contents, bool durable = true) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return WriteError("creating", path);
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd.get(), contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return WriteError("writing", path);
    done += static_cast<size_t>(n);
  }
  if (durable && ::fsync(fd.get()) != 0) return WriteError("fsync of", path);
  if (fd.Close() != 0) return WriteError("closing", path);
  return Status::Ok();
}

// Gives the unnamed file (O_TMPFILE) open as `fd` the name `path`; 0 or -1 with errno, as link(). linkat() with
// AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH on older kernels; the file's /proc/self/fd link works for its opener.
int LinkUnnamedFile(int fd, const fs::path& path) {
  if (::linkat(fd, "", AT_FDCWD, path.c_str(), AT_EMPTY_PATH) == 0) return 0;
  if (errno != EPERM && errno != ENOENT && errno != EINVAL) return -1;
  const std::string proc_path = "/proc/self/fd/" + std::to_string(fd);
  return ::linkat(AT_FDCWD, proc_path.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW);
}

bool IsHexSha256(std::string_view s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

fs::path SidecarPath(const fs::path& blob) { return fs::path(blob.string() + std::string(kSidecarSuffix)); }

// Unlinks the blob's file (and its sidecar): false if there is none. Its directory is not synced.
StatusOr<bool> UnlinkBlob(const fs::path& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return false;
    return UnavailableError(Errno("removing", path));
  }
  ::unlink(SidecarPath(path).c_str());  // may be missing; a stale sidecar would only be a wrong cache for a re-Put
  return true;
}

// Put's error for a key one of whose directories is a blob.
Status BlobInTheWayError(std::string_view key) {
  return FailedPreconditionError("blob '" + std::string(key) +
                                 "' cannot be stored: a blob exists where one of its directories would be");
}

// The error of Put's failed link() to the blob's final name (errno set).
Status LinkError(std::string_view key, const fs::path& final_path) {
  if (errno == EEXIST) return AlreadyExistsError("blob '" + std::string(key) + "' already exists");
  // A spare is opened by its own name, so a blob on the key's path shows only here.
  if (errno == ENOTDIR) return BlobInTheWayError(key);
  return WriteError("linking", final_path);
}

// Writes all of `chunk` to `fd`, at most kMaxWriteBytes at a time.
Status WriteChunk(int fd, std::span<const std::byte> chunk, const fs::path& path) {
  size_t done = 0;
  while (done < chunk.size()) {
    ssize_t w = ::write(fd, chunk.data() + done, std::min(chunk.size() - done, kMaxWriteBytes));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return WriteError("writing", path);
    done += static_cast<size_t>(w);
  }
  return Status::Ok();
}

// A blob's bytes as Put received them: how many, and their sha256 (hex).
struct ReceivedBlob {
  uint64_t size_bytes;
  std::string sha256;
};

// Reads `data` to its end into the file open as `fd`, hashing it on the way; ResourceExhausted past
// options.max_size_bytes.
StatusOr<ReceivedBlob> ReceiveInto(int fd, ByteSource& data, std::string_view key, const fs::path& final_path,
                                   const PutOptions& options) {
  // Hashing on a second thread needs a second buffer: the next chunk is read while the last one is hashed.
  // Not zero-filled: a job's setup puts thousands of small shard files, and clearing 1 MiB for each was most of it.
  const size_t num_buffers = options.hash_on_second_thread ? 2 : 1;
  const std::unique_ptr<std::byte[]> buffer = std::make_unique_for_overwrite<std::byte[]>(num_buffers * kChunkBytes);
  // Declared after the buffer, so that on an early return the hashing thread is done with it before it is freed.
  std::optional<Sha256> hasher;
  std::optional<BackgroundSha256> background_hasher;
  if (options.hash_on_second_thread) {
    background_hasher.emplace();
  } else {
    hasher.emplace();
  }
  uint64_t size_bytes = 0;
  for (size_t turn = 0;; ++turn) {
    const std::span<std::byte> chunk(buffer.get() + (turn % num_buffers) * kChunkBytes, kChunkBytes);
    PARSYN_ASSIGN_OR_RETURN(size_t n, data.Read(chunk));
    if (n == 0) break;
    size_bytes += n;
    if (options.max_size_bytes && size_bytes > *options.max_size_bytes) {
      return ResourceExhaustedError("blob '" + std::string(key) + "' is larger than the limit of " +
                                    std::to_string(*options.max_size_bytes) + " bytes");
    }
    const std::span<const std::byte> received(chunk.data(), n);
    if (background_hasher) {
      background_hasher->Update(received);
    } else {
      hasher->Update(received);
    }
    if (options.observe_chunk) PARSYN_RETURN_IF_ERROR(options.observe_chunk(received));
    PARSYN_RETURN_IF_ERROR(WriteChunk(fd, received, final_path));
    // A durable blob's pages start going to disk now, while the next chunks are read and hashed, so the fsync
    // below waits only for the last of them. Asynchronous and advisory: the fsync is what makes the blob durable.
    if (options.durable) {
      ::sync_file_range(fd, static_cast<off_t>(size_bytes - n), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE);
    }
  }
  return ReceivedBlob{size_bytes, background_hasher ? background_hasher->HexDigest() : hasher->HexDigest()};
}

// Gives the sidecar written under `sidecar_temp` the blob's sidecar name; where it cannot, removes any sidecar of an
// earlier blob there (Head then hashes the blob again).
void PublishSidecar(const fs::path& sidecar_temp, const fs::path& final_path, RemoveOnExit& remove_sidecar_temp) {
  if (::rename(sidecar_temp.c_str(), SidecarPath(final_path).c_str()) == 0) {
    remove_sidecar_temp.Release();
  } else {
    ::unlink(SidecarPath(final_path).c_str());  // never leave a sidecar of an earlier blob: Head rehashes instead
  }
}

}  // namespace

StatusOr<std::unique_ptr<DirectoryBlobStore>> DirectoryBlobStore::Open(const fs::path& root) {
  return Open(root, Options{});
}

StatusOr<std::unique_ptr<DirectoryBlobStore>> DirectoryBlobStore::Open(const fs::path& root, Options options) {
  std::error_code ec;
  fs::path absolute = fs::absolute(root, ec);
  if (ec) return UnavailableError("resolving blob directory " + root.string() + ": " + ec.message());
  // Created one level at a time so each new directory's entry is fsynced, as for the blobs' own directories.
  PARSYN_RETURN_IF_ERROR(EnsureDirs(absolute.root_path(), absolute.relative_path(),
                                    [](const fs::path&, bool created) { return created; }));

  // A crash mid-Put leaves a temp file that no blob refers to; nobody else can be writing while we open.
  int swept = 0;
  for (auto it = fs::recursive_directory_iterator(absolute, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file(ec) && it->path().filename().string().find(kTempMarker) != std::string::npos) {
      if (::unlink(it->path().c_str()) == 0) ++swept;
    }
  }
  if (ec) return UnavailableError("scanning blob directory " + absolute.string() + ": " + ec.message());
  if (swept > 0) PARSYN_LOG_INFO("blob store {}: removed {} stale temp file(s)", absolute.string(), swept);
  return std::unique_ptr<DirectoryBlobStore>(new DirectoryBlobStore(absolute, std::move(options)));
}

DirectoryBlobStore::~DirectoryBlobStore() {
  if (sweeper_.joinable()) {
    sweeper_.request_stop();
    sweeper_.join();
  }
  for (const auto& [expires, spare] : spares_) ::unlink(spare.path.c_str());
}

StatusOr<BlobInfo> DirectoryBlobStore::Put(std::string_view key, ByteSource& data, const PutOptions& options) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  const fs::path final_path = root_ / fs::path(key);
  const fs::path dir = final_path.parent_path();
  // A non-durable Put into a directory that exists (a round's updates, after the first) needs no mkdir of each
  // level: one check instead of five calls per update.
  if (options.durable || ::access(dir.c_str(), F_OK) != 0) {
    PARSYN_RETURN_IF_ERROR(EnsureKeyDirs(fs::path(key).parent_path(), options.durable));
  }
  if (::access(final_path.c_str(), F_OK) == 0) {
    return AlreadyExistsError("blob '" + std::string(key) + "' already exists");
  }

  const std::string suffix = UniqueTempSuffix();
  // A non-durable Put writes over a spare, whose pages are in memory, when there is one. It is then published like
  // a named temp file (link, and the spare's name unlinked on return), after it is cut to the new size.
  std::optional<Spare> spare = options.durable ? std::nullopt : TakeSpare(options.size_hint);
  const auto [raw_fd, temp_path] = OpenBlobFile(spare, final_path, suffix);
  RemoveOnExit remove_temp(temp_path);  // an empty path: nothing to remove
  Fd fd(raw_fd);
  if (fd.get() < 0 && errno == ENOTDIR) return BlobInTheWayError(key);
  if (fd.get() < 0) return WriteError("creating", final_path);

  const auto start = std::chrono::steady_clock::now();
  PARSYN_ASSIGN_OR_RETURN(const ReceivedBlob received, ReceiveInto(fd.get(), data, key, final_path, options));
  const uint64_t size_bytes = received.size_bytes;
  // A spare was no larger than the hint; a blob shorter than the spare would cut the file under a reader that may
  // still map the spare's old blob (SIGBUS there), so it is not stored.
  if (spare && !temp_path.empty()) {
    if (size_bytes < spare->size_bytes) {
      return UnavailableError("blob '" + std::string(key) + "' ended at " + std::to_string(size_bytes) +
                              " bytes, short of the " + std::to_string(*options.size_hint) + " announced");
    }
    if (::ftruncate(fd.get(), static_cast<off_t>(size_bytes)) != 0) return WriteError("truncating", final_path);
  }
  const auto written = std::chrono::steady_clock::now();
  BlobInfo info{std::string(key), size_bytes, received.sha256};
  if (options.expected_sha256 && *options.expected_sha256 != info.sha256) {
    return DataLossError("blob '" + std::string(key) + "' has sha256 " + info.sha256 + ", expected " +
                         *options.expected_sha256);
  }
  // The sha256 travels with the blob's inode (an extended attribute, set before the blob gets its name): no second
  // file, so a Put allocates one inode, not two (a job's setup puts 20,000 shard files; a round, 10,000 updates).
  const bool sha256_in_xattr =
      ::fsetxattr(fd.get(), kSha256Xattr, info.sha256.data(), info.sha256.size(), /*flags=*/0) == 0;
  // A spare's file still carries its old blob's sha256: gone, so Head never trusts it.
  if (!sha256_in_xattr && spare && !temp_path.empty()) ::fremovexattr(fd.get(), kSha256Xattr);
  if (options.durable && ::fsync(fd.get()) != 0) return WriteError("fsync of", final_path);
  // A named temp file is closed before it is published, so a failing close() is reported before anyone sees the
  // blob; an unnamed one is closed after linkat(), which needs its descriptor.
  if (!temp_path.empty() && fd.Close() != 0) return WriteError("closing", final_path);
  const auto synced = std::chrono::steady_clock::now();
  // Where the file system has no user extended attributes, a sidecar file holds the sha256. It goes in first (under
  // its own temp name) so a blob is rarely seen without it; it is only a cache, so it is not fsynced (one journal
  // commit less per durable Put): after a crash its name may hold no bytes, and Head then hashes the blob again.
  const fs::path sidecar_temp = fs::path(SidecarPath(final_path).string() + suffix);
  RemoveOnExit remove_sidecar_temp(sha256_in_xattr ? fs::path() : sidecar_temp);
  if (!sha256_in_xattr) PARSYN_RETURN_IF_ERROR(WriteSmallFile(sidecar_temp, info.sha256, /*durable=*/false));

  // link() is atomic and fails if the name exists: the blob appears whole, and exactly one racing Put wins.
  const int linked =
      temp_path.empty() ? LinkUnnamedFile(fd.get(), final_path) : ::link(temp_path.c_str(), final_path.c_str());
  if (linked != 0) return LinkError(key, final_path);
  if (temp_path.empty() && fd.Close() != 0) {
    const Status closing = WriteError("closing", final_path);
    ::unlink(final_path.c_str());  // not published after all (close() fails on local file systems all but never)
    return closing;
  }
  if (!sha256_in_xattr) PublishSidecar(sidecar_temp, final_path, remove_sidecar_temp);
  // remove_temp unlinks the temp name on return; the blob keeps its data through the final name.
  if (options.durable) PARSYN_RETURN_IF_ERROR(FsyncDir(dir));
  using Millis = std::chrono::duration<double, std::milli>;
  PARSYN_LOG_DEBUG("blob store: put {} ({} bytes): receive+hash+write {:.1f} ms, fsync {:.1f} ms, publish {:.1f} ms",
                   key, size_bytes, Millis(written - start).count(), Millis(synced - written).count(),
                   Millis(std::chrono::steady_clock::now() - synced).count());
  return info;
}

std::pair<int, fs::path> DirectoryBlobStore::OpenBlobFile(const std::optional<Spare>& spare, const fs::path& final_path,
                                                          const std::string& temp_suffix) {
  // The bytes go into an unnamed file (O_TMPFILE) that linkat() names once it is whole: one change to the directory
  // per Put, not three (create, link and unlink a temp name). Those took the directory's lock, which 16 upload
  // threads contended on (spinning) when 10,000 updates of a round went into one directory. File systems without
  // O_TMPFILE get a named temp file instead.
  fs::path temp_path;
  int raw_fd = -1;
  if (spare) {
    raw_fd = ::open(spare->path.c_str(), O_WRONLY | O_CLOEXEC);
    if (raw_fd >= 0) {
      temp_path = spare->path;
      ++spares_reused_;
    } else {
      ::unlink(spare->path.c_str());
    }
  }
  if (raw_fd < 0) raw_fd = ::open(final_path.parent_path().c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  if (raw_fd < 0 && temp_path.empty() && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    temp_path = fs::path(final_path.string() + temp_suffix);
    raw_fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  }
  return {raw_fd, std::move(temp_path)};
}

Status DirectoryBlobStore::EnsureKeyDirs(const fs::path& relative, bool durable) {
  if (!durable) return EnsureDirs(root_, relative, [](const fs::path&, bool) { return false; });
  // A directory that existed may have been created by a non-durable Put (a round's updates), its entry never synced:
  // it is synced unless this store did so before. One that Put creates now is a new entry, synced whatever the record.
  return EnsureDirs(
      root_, relative,
      [this](const fs::path& dir, bool created) {
        std::lock_guard lock(synced_dirs_mu_);
        return created || !synced_dirs_.contains(dir.string());
      },
      [this](const fs::path& dir) {
        ++path_entry_syncs_;
        std::lock_guard lock(synced_dirs_mu_);
        synced_dirs_.insert(dir.string());
      });
}

Status DirectoryBlobStore::SyncAll() {
  // syncfs: one flush of the store's file system instead of an fsync per file and directory (a job's shards).
  Fd fd(::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return UnavailableError(Errno("opening", root_));
  if (::syncfs(fd.get()) != 0) return WriteError("syncfs of", root_);
  return Status::Ok();
}

StatusOr<std::unique_ptr<ByteSource>> DirectoryBlobStore::Get(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  StatusOr<std::unique_ptr<ByteSource>> source = OpenFileSource(root_ / fs::path(key));
  if (!source.ok() && source.status().code() == StatusCode::kNotFound) {
    return NotFoundError("blob '" + std::string(key) + "' not found");
  }
  return source;
}

StatusOr<BlobInfo> DirectoryBlobStore::Head(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  const fs::path path = root_ / fs::path(key);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return NotFoundError("blob '" + std::string(key) + "' not found");
    return UnavailableError(Errno("stat of", path));
  }
  if (!S_ISREG(st.st_mode)) return NotFoundError("blob '" + std::string(key) + "' not found");
  BlobInfo info{std::string(key), static_cast<uint64_t>(st.st_size), ""};

  char xattr[64];
  if (::getxattr(path.c_str(), kSha256Xattr, xattr, sizeof xattr) == sizeof xattr &&
      IsHexSha256(std::string_view(xattr, sizeof xattr))) {
    info.sha256.assign(xattr, sizeof xattr);
    return info;
  }
  StatusOr<std::unique_ptr<ByteSource>> sidecar = OpenFileSource(SidecarPath(path));
  if (sidecar.ok()) {
    StatusOr<std::string> text = ReadAll(**sidecar, 128);
    if (text.ok() && IsHexSha256(*text)) {
      info.sha256 = *std::move(text);
      return info;
    }
  }
  // No usable sidecar (a crash between link and rename, or a damaged file): the blob is immutable, so hash it again.
  PARSYN_ASSIGN_OR_RETURN(info.sha256, Sha256File(path));
  if (::setxattr(path.c_str(), kSha256Xattr, info.sha256.data(), info.sha256.size(), /*flags=*/0) == 0) return info;
  const fs::path sidecar_temp = fs::path(SidecarPath(path).string() + UniqueTempSuffix());
  if (WriteSmallFile(sidecar_temp, info.sha256).ok()) {
    if (::rename(sidecar_temp.c_str(), SidecarPath(path).c_str()) != 0) ::unlink(sidecar_temp.c_str());
  } else {
    ::unlink(sidecar_temp.c_str());  // the sidecar is a cache; the next Head hashes again
  }
  return info;
}

StatusOr<fs::path> DirectoryBlobStore::LocalPath(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(Head(key).status());
  return root_ / fs::path(key);
}

Status DirectoryBlobStore::Delete(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  const fs::path path = root_ / fs::path(key);
  PARSYN_ASSIGN_OR_RETURN(bool removed, UnlinkBlob(path));
  if (!removed) return NotFoundError("blob '" + std::string(key) + "' not found");
  return FsyncDir(path.parent_path());
}

Status DirectoryBlobStore::DeleteAll(std::span<const std::string> keys) {
  for (const std::string& key : keys) PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  std::set<fs::path> dirs;  // each synced once, after its blobs are gone
  for (const std::string& key : keys) {
    const fs::path path = root_ / fs::path(key);
    PARSYN_ASSIGN_OR_RETURN(bool removed, UnlinkBlob(path));
    if (removed) dirs.insert(path.parent_path());
  }
  for (const fs::path& dir : dirs) PARSYN_RETURN_IF_ERROR(FsyncDir(dir));
  return Status::Ok();
}

Status DirectoryBlobStore::Recycle(std::span<const std::string> keys) {
  for (const std::string& key : keys) PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  std::set<fs::path> dirs;  // each synced once, after its blobs are gone
  for (const std::string& key : keys) {
    const fs::path path = root_ / fs::path(key);
    struct statx st;
    if (::statx(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW, STATX_TYPE | STATX_SIZE | STATX_BTIME, &st) != 0 ||
        !S_ISREG(st.stx_mode)) {
      continue;  // missing: skipped, as DeleteAll does
    }
    // The file's age is how long its first pages may have been dirty; without a birth time it is not kept.
    std::optional<Clock::time_point> expires;
    if ((st.stx_mask & STATX_BTIME) != 0) {
      const auto born = std::chrono::system_clock::time_point(std::chrono::seconds(st.stx_btime.tv_sec) +
                                                              std::chrono::nanoseconds(st.stx_btime.tv_nsec));
      const auto age = std::max(std::chrono::system_clock::now() - born, std::chrono::system_clock::duration(0));
      if (age < options_.spare_max_age) {
        expires = Clock::now() + std::chrono::duration_cast<Clock::duration>(options_.spare_max_age - age);
      }
    }
    bool kept = false;
    if (expires) {
      const fs::path spare_path = root_ / ("spare" + UniqueTempSuffix());  // a temp name: Open sweeps it
      if (::rename(path.c_str(), spare_path.c_str()) == 0) {
        std::lock_guard lock(spares_mu_);
        if (spare_bytes_ + st.stx_size <= options_.max_spare_bytes) {
          spares_.emplace(*expires, Spare{spare_path, st.stx_size});
          spare_bytes_ += st.stx_size;
          if (!sweeper_.joinable()) sweeper_ = std::jthread([this](std::stop_token stop) { SweepSpares(stop); });
          spares_changed_.notify_all();
        } else {
          ::unlink(spare_path.c_str());
        }
        kept = true;
      }
    }
    if (!kept && ::unlink(path.c_str()) != 0 && errno != ENOENT) return UnavailableError(Errno("removing", path));
    ::unlink(SidecarPath(path).c_str());
    dirs.insert(path.parent_path());
  }
  for (const fs::path& dir : dirs) PARSYN_RETURN_IF_ERROR(FsyncDir(dir));
  return Status::Ok();
}

size_t DirectoryBlobStore::spares() const {
  std::lock_guard lock(spares_mu_);
  return spares_.size();
}

std::optional<DirectoryBlobStore::Spare> DirectoryBlobStore::TakeSpare(std::optional<uint64_t> size_hint) {
  if (!size_hint) return std::nullopt;
  std::lock_guard lock(spares_mu_);
  DropExpiredSpares(Clock::now());
  // A round's updates are all one size, so the youngest fits; a few more are looked at, not the whole list.
  constexpr int kCandidates = 8;
  int looked = 0;
  for (auto it = spares_.rbegin(); it != spares_.rend() && looked < kCandidates; ++it, ++looked) {
    if (it->second.size_bytes > *size_hint) continue;
    Spare spare = std::move(it->second);
    spares_.erase(std::next(it).base());
    spare_bytes_ -= spare.size_bytes;
    return spare;
  }
  return std::nullopt;
}

void DirectoryBlobStore::DropExpiredSpares(Clock::time_point now) {
  while (!spares_.empty() && spares_.begin()->first <= now) {
    ::unlink(spares_.begin()->second.path.c_str());
    spare_bytes_ -= spares_.begin()->second.size_bytes;
    spares_.erase(spares_.begin());
  }
}

void DirectoryBlobStore::SweepSpares(std::stop_token stop) {
  std::unique_lock lock(spares_mu_);
  while (!stop.stop_requested()) {
    DropExpiredSpares(Clock::now());
    if (spares_.empty()) {
      spares_changed_.wait(lock, stop, [this] { return !spares_.empty(); });
    } else {
      // Until the earliest expires, or a spare that expires sooner comes (a copy: the entry may go meanwhile).
      const Clock::time_point next = spares_.begin()->first;
      spares_changed_.wait_until(lock, stop, next, [&] { return !spares_.empty() && spares_.begin()->first < next; });
    }
  }
}

StatusOr<std::vector<std::string>> DirectoryBlobStore::List(std::string_view prefix) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKeyPrefix(prefix));
  size_t slash = prefix.rfind('/');
  fs::path start = slash == std::string_view::npos ? root_ : root_ / fs::path(prefix.substr(0, slash));
  std::vector<std::string> keys;
  std::error_code ec;
  if (!fs::is_directory(start, ec)) return keys;
  for (auto it = fs::recursive_directory_iterator(start, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    std::string key = it->path().lexically_relative(root_).generic_string();
    // Skips sidecars, temp files and anything else that is not a blob someone Put.
    if (!key.starts_with(prefix) || !ValidateBlobKey(key).ok()) continue;
    keys.push_back(std::move(key));
  }
  if (ec) return UnavailableError("listing " + start.string() + ": " + ec.message());
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace parsyn::storage
