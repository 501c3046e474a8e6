#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "base/sha256.h"
#include "storage/blob_store.h"
#include "storage/blob_store_contract.h"
#include "storage/directory_blob_store.h"
#include "storage/local_blob_copy.h"
#include "storage/memory_blob_store.h"
#include "storage/temp_dir_for_test.h"

namespace parsyn::storage {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

INSTANTIATE_TEST_SUITE_P(
    Backends, BlobStoreContractTest,
    ::testing::Values(BlobStoreBackend{"directory",
                                       [](const fs::path& dir) -> StatusOr<std::unique_ptr<BlobStore>> {
                                         return OpenBlobStore("file://" + (dir / "blobs").string());
                                       }},
                      BlobStoreBackend{"memory",
                                       [](const fs::path&) -> StatusOr<std::unique_ptr<BlobStore>> {
                                         return std::unique_ptr<BlobStore>(std::make_unique<MemoryBlobStore>());
                                       }}),
    BlobStoreBackendName);

struct KeyCase {
  std::string key;
  std::string error_fragment;  // empty: the key is valid
};

TEST(ValidateBlobKeyTest, Table) {
  const std::vector<KeyCase> cases = {
      {"jobs/17/rounds/000003/global.safetensors", ""},
      {"datasets/42.jsonl", ""},
      {"a", ""},
      {"A-Z_a-z.0-9", ""},
      {".hidden", ""},  // not only dots: an ordinary name
      {std::string(kMaxBlobKeyBytes, 'k'), ""},
      {"", "it is empty"},
      {"../x", "segment '..' is made only of dots"},
      {"a/../b", "segment '..' is made only of dots"},
      {"a/./b", "segment '.' is made only of dots"},
      {"...", "segment '...' is made only of dots"},
      {"/etc/passwd", "it starts with '/'"},
      {"a//b", "empty segment"},
      {"a/", "it ends with '/'"},
      {"a\\b", "contains '\\x5c'"},
      {std::string("a\0b", 3), "contains '\\x00'"},
      {"a b", "contains ' '"},
      {"a#tmp-1", "contains '#'"},
      {"caf\xc3\xa9", "contains '\\xc3'"},
      {"a\nb", "contains '\\x0a'"},
      {std::string(kMaxBlobKeyBytes + 1, 'k'), "513 bytes long, the limit is 512"},
  };
  for (const KeyCase& c : cases) {
    Status s = ValidateBlobKey(c.key);
    if (c.error_fragment.empty()) {
      EXPECT_TRUE(s.ok()) << c.key << ": " << s.ToString();
    } else {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.key;
      EXPECT_THAT(s.message(), HasSubstr(c.error_fragment)) << c.key;
    }
  }
}

TEST(ValidateBlobKeyTest, MessagesEscapeAndShortenTheKey) {
  Status s = ValidateBlobKey(std::string(2000, '/'));
  EXPECT_THAT(s.message(), HasSubstr("...'"));
  EXPECT_LT(s.message().size(), 200u);
  EXPECT_THAT(ValidateBlobKey("x\x01y").message(), HasSubstr("'x\\x01y'"));
}

TEST(ValidateBlobKeyPrefixTest, AcceptsPartialKeysAndRejectsEscapes) {
  for (std::string_view ok : {"", "jobs", "jobs/", "jobs/1/sh", "jobs/1/..", "."}) {
    EXPECT_TRUE(ValidateBlobKeyPrefix(ok).ok()) << ok;
  }
  for (std::string_view bad : {"/", "/jobs", "../", "a/../", "a//", "a b", "a/\\"}) {
    EXPECT_EQ(ValidateBlobKeyPrefix(bad).code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(OpenBlobStoreTest, ChoosesByScheme) {
  TempDirForTest dir;
  StatusOr<std::unique_ptr<BlobStore>> by_uri = OpenBlobStore("file://" + (dir.path() / "u").string());
  ASSERT_TRUE(by_uri.ok()) << by_uri.status().ToString();
  StatusOr<std::unique_ptr<BlobStore>> by_path = OpenBlobStore((dir.path() / "p").string());
  ASSERT_TRUE(by_path.ok()) << by_path.status().ToString();
  EXPECT_TRUE(fs::is_directory(dir.path() / "u"));
  EXPECT_TRUE(fs::is_directory(dir.path() / "p"));

  StatusOr<std::unique_ptr<BlobStore>> gs = OpenBlobStore("gs://bucket/prefix");
  EXPECT_EQ(gs.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(gs.status().message(), HasSubstr("scheme 'gs' is not supported"));
  EXPECT_THAT(gs.status().message(), HasSubstr("file:///"));
  EXPECT_EQ(OpenBlobStore("file://host/dir").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenBlobStore("").status().code(), StatusCode::kInvalidArgument);
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A blob's sha256 as the directory store keeps it with the file (an extended attribute); "" if it has none.
std::string Sha256Attribute(const fs::path& path) {
  char value[128];
  const ssize_t n = ::getxattr(path.c_str(), "user.parsyn.sha256", value, sizeof value);
  return n < 0 ? "" : std::string(value, static_cast<size_t>(n));
}

TEST(DirectoryBlobStoreTest, LaysBlobsOutUnderTheRootWithTheirSha256) {
  TempDirForTest dir;
  auto store = DirectoryBlobStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  StringByteSource source("abc");
  ASSERT_TRUE((*store)->Put("jobs/1/global.safetensors", source).ok());
  EXPECT_EQ(ReadFile(dir.path() / "jobs/1/global.safetensors"), "abc");
  EXPECT_EQ(Sha256Attribute(dir.path() / "jobs/1/global.safetensors"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_FALSE(fs::exists(dir.path() / "jobs/1/global.safetensors#sha256")) << "no sidecar where attributes work";
  EXPECT_EQ(*(*store)->LocalPath("jobs/1/global.safetensors"), dir.path() / "jobs/1/global.safetensors");
  // Only the blob is listed; no temp files are left behind.
  EXPECT_THAT(*(*store)->List(""), ElementsAre("jobs/1/global.safetensors"));
  for (const auto& entry : fs::recursive_directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().string().find("#tmp-"), std::string::npos) << entry.path();
  }
}

// durable = false only waives the fsyncs: the blob is still whole, hashed (its sha256 kept) and create-only.
TEST(DirectoryBlobStoreTest, NonDurablePutIsStillCompleteAndCreateOnly) {
  TempDirForTest dir;
  auto store = DirectoryBlobStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  PutOptions not_durable;
  not_durable.durable = false;
  StringByteSource source("abc");
  StatusOr<BlobInfo> put = (*store)->Put("jobs/1/rounds/000001-a1/updates/w1.safetensors", source, not_durable);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(put->sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ReadFile(dir.path() / "jobs/1/rounds/000001-a1/updates/w1.safetensors"), "abc");
  EXPECT_EQ(Sha256Attribute(dir.path() / "jobs/1/rounds/000001-a1/updates/w1.safetensors"), put->sha256);
  StringByteSource again("xyz");
  EXPECT_EQ((*store)->Put("jobs/1/rounds/000001-a1/updates/w1.safetensors", again, not_durable).status().code(),
            StatusCode::kAlreadyExists);
  for (const auto& entry : fs::recursive_directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().string().find("#tmp-"), std::string::npos) << entry.path();
  }
}

ino_t InodeOf(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

int TempFilesUnder(const fs::path& root) {
  int n = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    n += entry.path().filename().string().find("#tmp-") != std::string::npos ? 1 : 0;
  }
  return n;
}

// Recycle keeps a blob's file as a spare; the next non-durable Put whose announced size is no smaller writes over it
// (the same inode, its pages in memory), and is exactly its own bytes: longer than the spare, its hash, no tail.
TEST(DirectoryBlobStoreTest, RecycledFilesAreWrittenOverByLaterNonDurablePutsOfNoSmallerSize) {
  TempDirForTest dir;
  auto store = DirectoryBlobStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  DirectoryBlobStore& blobs = **store;
  PutOptions not_durable;
  not_durable.durable = false;
  StringByteSource first(std::string(100'000, 'a'));
  ASSERT_TRUE(blobs.Put("jobs/1/rounds/000001-a1/updates/w1", first, not_durable).ok());
  const ino_t inode = InodeOf(dir.path() / "jobs/1/rounds/000001-a1/updates/w1");
  const std::vector<std::string> round1 = {"jobs/1/rounds/000001-a1/updates/w1"};
  ASSERT_TRUE(blobs.Recycle(round1).ok());
  EXPECT_EQ(blobs.Head(round1[0]).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(blobs.spares(), 1u);
  EXPECT_THAT(*blobs.List(""), IsEmpty()) << "a spare is no blob";

  // Not over the spare: a durable Put, one with no announced size, one announced smaller than the spare.
  StringByteSource global("global");
  ASSERT_TRUE(blobs.Put("jobs/1/global", global).ok());
  StringByteSource unknown("unknown size");
  ASSERT_TRUE(blobs.Put("jobs/1/rounds/000002-a1/updates/w0", unknown, not_durable).ok());
  PutOptions smaller = not_durable;
  smaller.size_hint = 99'999;
  StringByteSource small(std::string(99'999, 's'));
  ASSERT_TRUE(blobs.Put("jobs/1/rounds/000002-a1/updates/w2", small, smaller).ok());
  EXPECT_EQ(blobs.spares_reused(), 0u);
  EXPECT_EQ(blobs.spares(), 1u);

  PutOptions larger = not_durable;
  larger.size_hint = 100'001;
  const std::string bytes = std::string(100'000, 'b') + "c";
  StringByteSource second(bytes);
  StatusOr<BlobInfo> put = blobs.Put("jobs/1/rounds/000002-a1/updates/w1", second, larger);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(blobs.spares_reused(), 1u);
  EXPECT_EQ(blobs.spares(), 0u);
  const fs::path path = dir.path() / "jobs/1/rounds/000002-a1/updates/w1";
  EXPECT_EQ(InodeOf(path), inode);
  EXPECT_EQ(ReadFile(path), bytes);
  EXPECT_EQ(put->sha256, Sha256Hex(std::string_view(bytes)));
  EXPECT_EQ(blobs.Head("jobs/1/rounds/000002-a1/updates/w1")->sha256, put->sha256);
  EXPECT_EQ(TempFilesUnder(dir.path()), 0);

  // A Put over a spare whose bytes end short of the spare is refused: nothing stored, the spare gone.
  const std::vector<std::string> round2 = {"jobs/1/rounds/000002-a1/updates/w1"};
  ASSERT_TRUE(blobs.Recycle(round2).ok());
  PutOptions lying = not_durable;
  lying.size_hint = 200'000;
  StringByteSource short_body(std::string(10, 'x'));
  EXPECT_EQ(blobs.Put("jobs/1/rounds/000003-a1/updates/w1", short_body, lying).status().code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(blobs.Head("jobs/1/rounds/000003-a1/updates/w1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(blobs.spares(), 0u);
  EXPECT_EQ(TempFilesUnder(dir.path()), 0);
}

// Spares are unlinked once their file is older than spare_max_age (never reused after), past max_spare_bytes, and
// when the store closes.
TEST(DirectoryBlobStoreTest, SparesExpireStayUnderTheirBudgetAndGoWithTheStore) {
  TempDirForTest dir;
  PutOptions not_durable;
  not_durable.durable = false;
  auto put_two = [&](DirectoryBlobStore& blobs, const std::string& round) {
    std::vector<std::string> keys;
    for (const char* worker : {"w1", "w2"}) {
      keys.push_back("jobs/1/rounds/" + round + "/updates/" + worker);
      StringByteSource source(std::string(1000, 'u'));
      EXPECT_TRUE(blobs.Put(keys.back(), source, not_durable).ok());
    }
    return keys;
  };
  {
    auto store = DirectoryBlobStore::Open(dir.path(), {.spare_max_age = std::chrono::milliseconds(0)});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Recycle(put_two(**store, "000001-a1")).ok());
    EXPECT_EQ((*store)->spares(), 0u) << "too old to keep";
    EXPECT_EQ(TempFilesUnder(dir.path()), 0);
  }
  {
    auto store = DirectoryBlobStore::Open(dir.path(), {.max_spare_bytes = 1500});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Recycle(put_two(**store, "000002-a1")).ok());
    EXPECT_EQ((*store)->spares(), 1u) << "the second would pass the budget";
    EXPECT_EQ(TempFilesUnder(dir.path()), 1);
  }
  EXPECT_EQ(TempFilesUnder(dir.path()), 0) << "closing the store removes its spares";
  {
    auto store = DirectoryBlobStore::Open(dir.path(), {.spare_max_age = std::chrono::milliseconds(300)});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Recycle(put_two(**store, "000003-a1")).ok());
    EXPECT_EQ((*store)->spares(), 2u);
    // The store's sweeper unlinks them as they expire, with no Put to notice.
    for (int i = 0; i < 100 && TempFilesUnder(dir.path()) > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(TempFilesUnder(dir.path()), 0);
    EXPECT_EQ((*store)->spares(), 0u);
  }
}

// A durable Put makes each directory entry on its path durable once: the parents of directories this store already
// synced are not fsynced again, but a directory a non-durable Put created (a round's, by its updates) is, and so is
// one Put creates.
TEST(DirectoryBlobStoreTest, DurablePutSyncsEachDirectoryEntryOnTheKeysPathOnce) {
  TempDirForTest dir;
  auto store = DirectoryBlobStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  PutOptions not_durable;
  not_durable.durable = false;
  auto put = [&](const std::string& key, const PutOptions& options) {
    StringByteSource source(key);
    ASSERT_TRUE((*store)->Put(key, source, options).ok()) << key;
  };
  put("jobs/1/rounds/000001-a1/updates/w1.safetensors", not_durable);
  EXPECT_EQ((*store)->path_entry_syncs(), 0u);
  put("jobs/1/rounds/000001-a1/global.safetensors", {});  // jobs, 1, rounds, 000001-a1: all made by the update
  EXPECT_EQ((*store)->path_entry_syncs(), 4u);
  put("jobs/1/rounds/000002-a1/updates/w1.safetensors", not_durable);
  put("jobs/1/rounds/000002-a1/global.safetensors", {});  // only the new round's directory
  EXPECT_EQ((*store)->path_entry_syncs(), 5u);
  put("jobs/1/rounds/000002-a1/server_state.safetensors", {});
  EXPECT_EQ((*store)->path_entry_syncs(), 5u);
  put("jobs/1/rounds/000003-a1/global.safetensors", {});  // created by this Put
  EXPECT_EQ((*store)->path_entry_syncs(), 6u);
  // A directory removed behind the store's back and made again is a new entry: synced again.
  fs::remove_all(dir.path() / "jobs/1/rounds/000003-a1");
  put("jobs/1/rounds/000003-a1/global.safetensors", {});
  EXPECT_EQ((*store)->path_entry_syncs(), 7u);
}

// The kept sha256 is a cache: missing or damaged, Head hashes the blob again and keeps the result. A blob of a store
// written where attributes did not work has a sidecar file instead, which Head reads.
TEST(DirectoryBlobStoreTest, MissingOrDamagedSha256IsRecomputed) {
  TempDirForTest dir;
  auto store = DirectoryBlobStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  StringByteSource source("abc");
  ASSERT_TRUE((*store)->Put("k", source).ok());
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  const fs::path k = dir.path() / "k";

  ASSERT_EQ(::removexattr(k.c_str(), "user.parsyn.sha256"), 0);
  EXPECT_EQ((*store)->Head("k")->sha256, abc);
  EXPECT_EQ(Sha256Attribute(k), abc);  // written back

  const std::string garbage(64, 'z');
  ASSERT_EQ(::setxattr(k.c_str(), "user.parsyn.sha256", garbage.data(), garbage.size(), 0), 0);
  EXPECT_EQ((*store)->Head("k")->sha256, abc);

  std::ofstream(dir.path() / "old") << "abc";
  const std::string cached(64, '0');  // not abc's: proves the sidecar is what Head read
  std::ofstream(dir.path() / "old#sha256") << cached;
  EXPECT_EQ((*store)->Head("old")->sha256, cached);
  EXPECT_THAT(*(*store)->List(""), ElementsAre("k", "old"));
}

TEST(DirectoryBlobStoreTest, OpenSweepsStaleTempFilesAndKeepsBlobs) {
  TempDirForTest dir;
  fs::create_directories(dir.path() / "jobs/3");
  std::ofstream(dir.path() / "jobs/3/global.safetensors#tmp-999-0") << "half a blob";
  std::ofstream(dir.path() / "jobs/3/global.safetensors#sha256#tmp-999-0") << "half a sidecar";
  std::ofstream(dir.path() / "jobs/3/kept") << "whole";
  auto store = DirectoryBlobStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  EXPECT_FALSE(fs::exists(dir.path() / "jobs/3/global.safetensors#tmp-999-0"));
  EXPECT_FALSE(fs::exists(dir.path() / "jobs/3/global.safetensors#sha256#tmp-999-0"));
  EXPECT_THAT(*(*store)->List(""), ElementsAre("jobs/3/kept"));
  EXPECT_EQ((*store)->Head("jobs/3/kept")->size_bytes, 5u);
}

// A Put that dies half-way (kill -9 of the server mid-upload) leaves no blob and no file.
TEST(DirectoryBlobStoreTest, CrashMidPutLeavesNoBlob) {
  TempDirForTest dir;
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = DirectoryBlobStore::Open(dir.path());
    if (!store.ok()) ::_exit(2);
    class DyingSource final : public ByteSource {
     public:
      StatusOr<size_t> Read(std::span<std::byte> buffer) override {
        if (reads_++ == 1) ::_exit(0);  // the second read never returns: the process is gone
        std::memset(buffer.data(), 'x', 1000);
        return size_t{1000};
      }
      int reads_ = 0;
    } source;
    (void)(*store)->Put("jobs/1/update.safetensors", source);
    ::_exit(3);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus));
  ASSERT_EQ(WEXITSTATUS(wstatus), 0);

  // The child died with 1000 bytes written into an unnamed file (O_TMPFILE), which went with it: nothing under any
  // name is left, not even a temp file for Open to sweep (file systems without O_TMPFILE leave one: the test above).
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir.path())) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  EXPECT_THAT(files, IsEmpty());

  auto store = DirectoryBlobStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Head("jobs/1/update.safetensors").status().code(), StatusCode::kNotFound);
  EXPECT_THAT(*(*store)->List(""), IsEmpty());
  StringByteSource source("complete");
  EXPECT_TRUE((*store)->Put("jobs/1/update.safetensors", source).ok());
}

TEST(DirectoryBlobStoreTest, ListIgnoresFilesThatAreNotBlobs) {
  TempDirForTest dir;
  auto store = DirectoryBlobStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  std::ofstream(dir.path() / "has space") << "x";
  std::ofstream(dir.path() / "orphan#sha256") << "x";
  fs::create_symlink("/etc/passwd", dir.path() / "link");
  EXPECT_THAT(*(*store)->List(""), IsEmpty());
}

TEST(DirectoryBlobStoreTest, KeysThatWouldNestInsideABlobAreRefused) {
  TempDirForTest dir;
  auto store = DirectoryBlobStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  StringByteSource first("x");
  ASSERT_TRUE((*store)->Put("a/b", first).ok());
  StringByteSource nested("y");
  Status s = (*store)->Put("a/b/c", nested).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  StringByteSource parent("z");
  EXPECT_EQ((*store)->Put("a", parent).status().code(), StatusCode::kAlreadyExists);
  // Reads of such keys, and of directories, are plain NotFound.
  EXPECT_EQ((*store)->Get("a/b/c").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*store)->Head("a/b/c").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*store)->Get("a").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*store)->Head("a").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*store)->Delete("a").code(), StatusCode::kNotFound);
  EXPECT_THAT(*(*store)->List(""), ElementsAre("a/b"));
}

// PutOptions::observe_chunk sees every byte of the blob in order, and its error fails the Put with nothing stored;
// the same with the hashing on a second thread (hash_on_second_thread), which stores the same blob and sha256.
TEST(BlobStoreObserverTest, SeesEveryByteInOrderAndItsErrorFailsThePut) {
  TempDirForTest dir;
  auto directory = DirectoryBlobStore::Open(dir.path() / "blobs");
  ASSERT_TRUE(directory.ok());
  MemoryBlobStore memory;
  std::string bytes(3 * (1 << 20) + 12345, '\0');  // several of either store's chunks, the last one partial
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + i / 4096);
  for (BlobStore* store : {static_cast<BlobStore*>(directory->get()), static_cast<BlobStore*>(&memory)}) {
    for (bool second_thread : {false, true}) {
      SCOPED_TRACE(second_thread ? "hashing on a second thread" : "hashing on the Put's thread");
      const std::string suffix = second_thread ? "-2" : "-1";
      std::string seen;
      PutOptions options;
      options.hash_on_second_thread = second_thread;
      options.observe_chunk = [&](std::span<const std::byte> chunk) {
        seen.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
        return Status::Ok();
      };
      StringByteSource source(bytes);
      StatusOr<BlobInfo> put = store->Put("observed" + suffix, source, options);
      ASSERT_TRUE(put.ok()) << put.status().ToString();
      EXPECT_TRUE(seen == bytes) << "observer saw " << seen.size() << " of " << bytes.size() << " bytes";
      EXPECT_EQ(put->sha256, Sha256Hex(std::string_view(bytes)));
      StatusOr<std::unique_ptr<ByteSource>> got = store->Get("observed" + suffix);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      StatusOr<std::string> stored = ReadAll(**got);
      ASSERT_TRUE(stored.ok()) << stored.status().ToString();
      EXPECT_TRUE(*stored == bytes);

      // Refused after the first chunk: the chunk in hand is hashed while the Put returns.
      int chunks_seen = 0;
      options.observe_chunk = [&](std::span<const std::byte>) {
        return ++chunks_seen < 2 ? Status::Ok() : InvalidArgumentError("not what we wanted");
      };
      StringByteSource refused_source(bytes);
      StatusOr<BlobInfo> refused = store->Put("refused" + suffix, refused_source, options);
      EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(refused.status().message(), HasSubstr("not what we wanted"));
      EXPECT_EQ(store->Head("refused" + suffix).status().code(), StatusCode::kNotFound);
    }
  }
}

TEST(MemoryBlobStoreTest, FailNextPutsFailsThatManyThenRecovers) {
  MemoryBlobStore store;
  store.FailNextPuts(2, UnavailableError("disk full (injected)"));
  for (int i = 0; i < 2; ++i) {
    StringByteSource source("x");
    EXPECT_EQ(store.Put("k", source).status(), UnavailableError("disk full (injected)"));
  }
  EXPECT_EQ(store.Head("k").status().code(), StatusCode::kNotFound);
  StringByteSource source("x");
  EXPECT_TRUE(store.Put("k", source).ok());
}

TEST(MemoryBlobStoreTest, LocalPathIsFailedPrecondition) {
  MemoryBlobStore store;
  StringByteSource source("x");
  ASSERT_TRUE(store.Put("k", source).ok());
  Status s = store.LocalPath("k").status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("Get()"));
}

TEST(ByteSourceTest, ReadAllCapsTheSize) {
  StringByteSource source(std::string(100, 'x'));
  StatusOr<std::string> all = ReadAll(source, 99);
  EXPECT_EQ(all.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(OpenFileSource("/no/such/file").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace parsyn::storage

namespace parsyn::storage {
namespace {

size_t FilesIn(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir)) return 0;
  return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(dir), {}));
}

TEST(LocalBlobCopyTest, DirectoryStoreGivesItsOwnFileWithTheRecordedHash) {
  TempDirForTest dir;
  auto store = DirectoryBlobStore::Open(dir.path() / "blobs");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  StringByteSource bytes("directory bytes");
  ASSERT_TRUE((*store)->Put("a/b", bytes).ok());
  auto copy = LocalBlobCopy::Open(**store, "a/b", dir.path() / "spool");
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_FALSE(copy->downloaded());
  EXPECT_EQ(copy->path(), *(*store)->LocalPath("a/b"));
  EXPECT_EQ(copy->size_bytes(), 15u);
  EXPECT_EQ(copy->sha256(), Sha256Hex(std::string_view("directory bytes")));
  EXPECT_EQ(FilesIn(dir.path() / "spool"), 0u);
}

TEST(LocalBlobCopyTest, StoreWithoutFilesIsDownloadedHashedAndRemovedAfterwards) {
  TempDirForTest dir;
  MemoryBlobStore store;
  const std::string payload(3 << 20, 'x');  // several read buffers
  StringByteSource bytes(payload);
  ASSERT_TRUE(store.Put("jobs/1/u", bytes).ok());
  std::filesystem::path path;
  {
    auto copy = LocalBlobCopy::Open(store, "jobs/1/u", dir.path() / "spool");
    ASSERT_TRUE(copy.ok()) << copy.status().ToString();
    EXPECT_TRUE(copy->downloaded());
    path = copy->path();
    EXPECT_EQ(copy->size_bytes(), payload.size());
    EXPECT_EQ(copy->sha256(), Sha256Hex(payload));
    EXPECT_EQ(std::filesystem::file_size(path), payload.size());
    LocalBlobCopy moved = std::move(*copy);  // the moved-from copy must not remove the file
    EXPECT_TRUE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(FilesIn(dir.path() / "spool"), 0u);
}

TEST(LocalBlobCopyTest, OversizeBlobIsRefusedAndLeavesNothing) {
  TempDirForTest dir;
  MemoryBlobStore memory;
  auto directory = DirectoryBlobStore::Open(dir.path() / "blobs");
  ASSERT_TRUE(directory.ok());
  for (BlobStore* store : {static_cast<BlobStore*>(&memory), static_cast<BlobStore*>(directory->get())}) {
    StringByteSource bytes(std::string(100, 'y'));
    ASSERT_TRUE(store->Put("k", bytes).ok());
    auto copy = LocalBlobCopy::Open(*store, "k", dir.path() / "spool", 99);
    ASSERT_FALSE(copy.ok());
    EXPECT_EQ(copy.status().code(), StatusCode::kResourceExhausted);
    EXPECT_THAT(copy.status().message(), testing::HasSubstr("99 bytes allowed"));
    EXPECT_EQ(FilesIn(dir.path() / "spool"), 0u);
    EXPECT_EQ(LocalBlobCopy::Open(*store, "missing", dir.path() / "spool").status().code(), StatusCode::kNotFound);
  }
}

}  // namespace
}  // namespace parsyn::storage
