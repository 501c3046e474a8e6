#include "storage/blob_store_contract.h"

#include <gmock/gmock.h>

#include <cstring>
#include <functional>
#include <latch>
#include <thread>

#include "base/sha256.h"

namespace parsyn::storage {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr std::string_view kAbcSha256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr std::string_view kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// Yields `chunks` one per Read(), calling `before_read(i)` before chunk i (and before the final end-of-stream read,
// with i == chunks.size()). A non-OK status from the hook is returned from Read().
class ChunkedSource final : public ByteSource {
 public:
  ChunkedSource(std::vector<std::string> chunks, std::function<Status(size_t)> before_read = nullptr)
      : chunks_(std::move(chunks)), before_read_(std::move(before_read)) {}

  StatusOr<size_t> Read(std::span<std::byte> buffer) override {
    if (before_read_) PARSYN_RETURN_IF_ERROR(before_read_(next_));
    if (next_ == chunks_.size()) return size_t{0};
    const std::string& chunk = chunks_[next_++];
    if (chunk.size() > buffer.size()) return InternalError("test chunk larger than the store's read buffer");
    std::memcpy(buffer.data(), chunk.data(), chunk.size());
    return chunk.size();
  }

 private:
  std::vector<std::string> chunks_;
  std::function<Status(size_t)> before_read_;
  size_t next_ = 0;
};

}  // namespace

StatusOr<BlobInfo> PutString(BlobStore& store, std::string_view key, std::string bytes, const PutOptions& options) {
  StringByteSource source(std::move(bytes));
  return store.Put(key, source, options);
}

std::string GetString(BlobStore& store, std::string_view key) {
  StatusOr<std::unique_ptr<ByteSource>> source = store.Get(key);
  if (!source.ok()) return "<" + source.status().ToString() + ">";
  StatusOr<std::string> bytes = ReadAll(**source);
  return bytes.ok() ? *bytes : "<" + bytes.status().ToString() + ">";
}

std::string BlobStoreBackendName(const ::testing::TestParamInfo<BlobStoreBackend>& info) { return info.param.name; }

void BlobStoreContractTest::SetUp() {
  StatusOr<std::unique_ptr<BlobStore>> store = GetParam().make(scratch_.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  store_ = std::move(store).value();
}

TEST_P(BlobStoreContractTest, PutThenGetAndHeadReturnTheBytesSizeAndSha256) {
  StatusOr<BlobInfo> put = PutString(store(), "jobs/1/rounds/000001/global.safetensors", "abc");
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(put->key, "jobs/1/rounds/000001/global.safetensors");
  EXPECT_EQ(put->size_bytes, 3u);
  EXPECT_EQ(put->sha256, kAbcSha256);

  EXPECT_EQ(GetString(store(), "jobs/1/rounds/000001/global.safetensors"), "abc");
  StatusOr<BlobInfo> head = store().Head("jobs/1/rounds/000001/global.safetensors");
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->size_bytes, 3u);
  EXPECT_EQ(head->sha256, kAbcSha256);
}

TEST_P(BlobStoreContractTest, EmptyBlobIsABlob) {
  StatusOr<BlobInfo> put = PutString(store(), "empty", "");
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(put->sha256, kEmptySha256);
  EXPECT_EQ(GetString(store(), "empty"), "");
  EXPECT_EQ(store().Head("empty")->size_bytes, 0u);
}

TEST_P(BlobStoreContractTest, MultiChunkBlobRoundTrips) {
  // Larger than the 1 MiB buffers implementations read with, and not a multiple of them.
  std::string bytes(2 * 1024 * 1024 + 4097, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  StatusOr<BlobInfo> put = PutString(store(), "big.bin", bytes);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(put->size_bytes, bytes.size());
  EXPECT_EQ(put->sha256, Sha256Hex(std::string_view(bytes)));
  EXPECT_TRUE(GetString(store(), "big.bin") == bytes);
}

TEST_P(BlobStoreContractTest, PutIsCreateOnly) {
  ASSERT_TRUE(PutString(store(), "a/b", "first").ok());
  StatusOr<BlobInfo> again = PutString(store(), "a/b", "second");
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("'a/b'"));
  EXPECT_EQ(GetString(store(), "a/b"), "first");
  EXPECT_EQ(store().Head("a/b")->sha256, Sha256Hex(std::string_view("first")));
}

TEST_P(BlobStoreContractTest, MissingKeysAreNotFoundNamingTheKey) {
  for (Status s : {store().Get("no/such").status(), store().Head("no/such").status(),
                   store().LocalPath("no/such").status(), store().Delete("no/such")}) {
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("'no/such'"));
  }
}

TEST_P(BlobStoreContractTest, DeleteRemovesAndFreesTheKey) {
  ASSERT_TRUE(PutString(store(), "k", "old").ok());
  ASSERT_TRUE(store().Delete("k").ok());
  EXPECT_EQ(store().Head("k").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store().Delete("k").code(), StatusCode::kNotFound);
  ASSERT_TRUE(PutString(store(), "k", "new!").ok());
  EXPECT_EQ(GetString(store(), "k"), "new!");
  EXPECT_EQ(store().Head("k")->sha256, Sha256Hex(std::string_view("new!")));
}

TEST_P(BlobStoreContractTest, DeleteAllRemovesThoseThatExistAndSkipsTheMissing) {
  for (const char* key : {"r/1/u/a", "r/1/u/b", "r/1/keep", "r/2/u/c"}) ASSERT_TRUE(PutString(store(), key, key).ok());
  const std::vector<std::string> keys = {"r/1/u/a", "r/1/u/missing", "r/1/u/b", "r/2/u/c"};
  ASSERT_TRUE(store().DeleteAll(keys).ok());
  for (const std::string& key : keys) EXPECT_EQ(store().Head(key).status().code(), StatusCode::kNotFound) << key;
  EXPECT_EQ(GetString(store(), "r/1/keep"), "r/1/keep");
  EXPECT_TRUE(store().DeleteAll(keys).ok()) << "all missing: nothing to do";
  ASSERT_TRUE(PutString(store(), "r/1/u/a", "again").ok());
  // A bad key refuses the whole call before anything is removed.
  const std::vector<std::string> with_bad = {"r/1/u/a", "../escape"};
  EXPECT_EQ(store().DeleteAll(with_bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GetString(store(), "r/1/u/a"), "again");
}

// Recycle removes as DeleteAll does; whatever space a store keeps is invisible to its keys.
TEST_P(BlobStoreContractTest, RecycleRemovesLikeDeleteAllAndLaterPutsAreWhole) {
  PutOptions not_durable;
  not_durable.durable = false;
  for (const char* key : {"r/1/u/a", "r/1/u/b", "r/1/keep"}) {
    StringByteSource source(std::string(4096, key[6]));
    ASSERT_TRUE(store().Put(key, source, not_durable).ok());
  }
  const std::vector<std::string> keys = {"r/1/u/a", "r/1/u/missing", "r/1/u/b"};
  ASSERT_TRUE(store().Recycle(keys).ok());
  for (const std::string& key : keys) EXPECT_EQ(store().Head(key).status().code(), StatusCode::kNotFound) << key;
  EXPECT_THAT(*store().List("r/"), ElementsAre("r/1/keep"));
  not_durable.size_hint = 5000;
  StringByteSource longer(std::string(5000, 'z'));
  ASSERT_TRUE(store().Put("r/2/u/a", longer, not_durable).ok());
  EXPECT_EQ(GetString(store(), "r/2/u/a"), std::string(5000, 'z'));
  EXPECT_EQ(store().Head("r/2/u/a")->sha256, Sha256Hex(std::string_view(std::string(5000, 'z'))));
  const std::vector<std::string> with_bad = {"r/1/keep", "../escape"};
  EXPECT_EQ(store().Recycle(with_bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store().Head("r/1/keep")->size_bytes, 4096u);
}

TEST_P(BlobStoreContractTest, AnOpenStreamSurvivesDelete) {
  ASSERT_TRUE(PutString(store(), "k", "still here").ok());
  StatusOr<std::unique_ptr<ByteSource>> source = store().Get("k");
  ASSERT_TRUE(source.ok());
  ASSERT_TRUE(store().Delete("k").ok());
  EXPECT_EQ(*ReadAll(**source), "still here");
}

TEST_P(BlobStoreContractTest, LocalPathHoldsTheBytesOrIsFailedPrecondition) {
  ASSERT_TRUE(PutString(store(), "x/y.bin", "local bytes").ok());
  StatusOr<std::filesystem::path> path = store().LocalPath("x/y.bin");
  if (!path.ok()) {
    EXPECT_EQ(path.status().code(), StatusCode::kFailedPrecondition) << path.status().ToString();
    return;
  }
  StatusOr<std::unique_ptr<ByteSource>> file = OpenFileSource(*path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(*ReadAll(**file), "local bytes");
}

TEST_P(BlobStoreContractTest, OversizeUploadIsRefusedAndNothingStored) {
  PutOptions options;
  options.max_size_bytes = 4;
  StatusOr<BlobInfo> put = PutString(store(), "big", "12345", options);
  EXPECT_EQ(put.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(put.status().message(), HasSubstr("4 bytes"));
  EXPECT_EQ(store().Head("big").status().code(), StatusCode::kNotFound);
  EXPECT_THAT(*store().List(""), IsEmpty());
  EXPECT_TRUE(PutString(store(), "big", "1234", options).ok());  // exactly the limit is fine
}

TEST_P(BlobStoreContractTest, Sha256MismatchIsDataLossAndNothingStored) {
  PutOptions options;
  options.expected_sha256 = std::string(kEmptySha256);
  StatusOr<BlobInfo> put = PutString(store(), "u", "abc", options);
  EXPECT_EQ(put.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(put.status().message(), HasSubstr(std::string(kAbcSha256)));
  EXPECT_EQ(store().Head("u").status().code(), StatusCode::kNotFound);

  options.expected_sha256 = std::string(kAbcSha256);
  EXPECT_TRUE(PutString(store(), "u", "abc", options).ok());
}

TEST_P(BlobStoreContractTest, SourceErrorIsReturnedAndNothingStored) {
  ChunkedSource source({"part one,", "part two"},
                       [](size_t i) { return i == 1 ? UnavailableError("client went away") : Status::Ok(); });
  StatusOr<BlobInfo> put = store().Put("partial", source);
  EXPECT_EQ(put.status(), UnavailableError("client went away"));
  EXPECT_EQ(store().Head("partial").status().code(), StatusCode::kNotFound);
  EXPECT_THAT(*store().List(""), IsEmpty());
  EXPECT_TRUE(PutString(store(), "partial", "whole").ok());  // the key was never taken
}

TEST_P(BlobStoreContractTest, ABlobIsInvisibleUntilPutReturns) {
  int checks = 0;
  ChunkedSource source({"aaaa", "bbbb", "cccc"}, [&](size_t) {
    // Runs while Put is reading: the blob must not be seen yet, whole or partial.
    ++checks;
    if (store().Head("in/flight").status().code() != StatusCode::kNotFound) return InternalError("Head saw it");
    if (store().Get("in/flight").status().code() != StatusCode::kNotFound) return InternalError("Get saw it");
    StatusOr<std::vector<std::string>> keys = store().List("");
    if (!keys.ok() || !keys->empty()) return InternalError("List saw it");
    return Status::Ok();
  });
  StatusOr<BlobInfo> put = store().Put("in/flight", source);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(checks, 4);
  EXPECT_EQ(GetString(store(), "in/flight"), "aaaabbbbcccc");
}

TEST_P(BlobStoreContractTest, RacingPutsOfOneKeyHaveExactlyOneWinner) {
  std::latch both_reading(2);
  auto racer = [&](std::string bytes, StatusOr<BlobInfo>* result) {
    bool waited = false;
    ChunkedSource source({bytes}, [&](size_t) {
      // Both Puts are past any "is the key free?" check before either finishes.
      if (!waited) both_reading.arrive_and_wait();
      waited = true;
      return Status::Ok();
    });
    *result = store().Put("contended", source);
  };
  StatusOr<BlobInfo> a = InternalError("not run"), b = InternalError("not run");
  std::thread ta(racer, "from a", &a);
  std::thread tb(racer, "from b", &b);
  ta.join();
  tb.join();
  ASSERT_NE(a.ok(), b.ok()) << a.status().ToString() << " / " << b.status().ToString();
  const StatusOr<BlobInfo>& loser = a.ok() ? b : a;
  EXPECT_EQ(loser.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(GetString(store(), "contended"), a.ok() ? "from a" : "from b");
  EXPECT_EQ(store().Head("contended")->sha256, a.ok() ? a->sha256 : b->sha256);
  EXPECT_THAT(*store().List(""), ElementsAre("contended"));
}

TEST_P(BlobStoreContractTest, ListFiltersByPlainPrefixAndSorts) {
  for (std::string_view key : {"jobs/10/shard-0", "jobs/1/shard-1", "jobs/1/shard-0", "datasets/7.jsonl",
                               "jobs/1/rounds/000002/global.safetensors"}) {
    ASSERT_TRUE(PutString(store(), key, std::string(key)).ok()) << key;
  }
  EXPECT_THAT(*store().List("jobs/1/"),
              ElementsAre("jobs/1/rounds/000002/global.safetensors", "jobs/1/shard-0", "jobs/1/shard-1"));
  EXPECT_THAT(*store().List("jobs/1"), ElementsAre("jobs/1/rounds/000002/global.safetensors", "jobs/1/shard-0",
                                                   "jobs/1/shard-1", "jobs/10/shard-0"));
  EXPECT_THAT(*store().List("jobs/1/sh"), ElementsAre("jobs/1/shard-0", "jobs/1/shard-1"));
  EXPECT_THAT(*store().List("datasets"), ElementsAre("datasets/7.jsonl"));
  EXPECT_THAT(*store().List("nothing/here/"), IsEmpty());
  EXPECT_EQ(store().List("").value().size(), 5u);
}

TEST_P(BlobStoreContractTest, BadKeysAreInvalidArgumentForEveryCall) {
  for (std::string_view key : {"", "../x", "/etc/passwd", "a//b", "a/../../b", "a\\b", "trailing/"}) {
    EXPECT_EQ(PutString(store(), key, "x").status().code(), StatusCode::kInvalidArgument) << key;
    EXPECT_EQ(store().Get(key).status().code(), StatusCode::kInvalidArgument) << key;
    EXPECT_EQ(store().Head(key).status().code(), StatusCode::kInvalidArgument) << key;
    EXPECT_EQ(store().LocalPath(key).status().code(), StatusCode::kInvalidArgument) << key;
    EXPECT_EQ(store().Delete(key).code(), StatusCode::kInvalidArgument) << key;
  }
  for (std::string_view prefix : {"../", "/", "a//", "../../etc/", "a\\"}) {
    EXPECT_EQ(store().List(prefix).status().code(), StatusCode::kInvalidArgument) << prefix;
  }
  EXPECT_THAT(*store().List(""), IsEmpty());
}

}  // namespace parsyn::storage
