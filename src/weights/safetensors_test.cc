#include "weights/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace parsyn::weights {
namespace {

// A safetensors image from a literal header and data section (header length written little-endian).
std::vector<std::byte> Image(std::string_view header, size_t data_bytes = 0, uint64_t claimed_header_bytes = 0) {
  uint64_t length = claimed_header_bytes ? claimed_header_bytes : header.size();
  std::vector<std::byte> image(8 + header.size() + data_bytes, std::byte{0});
  for (int i = 0; i < 8; ++i) image[i] = static_cast<std::byte>(length >> (8 * i));
  std::memcpy(image.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) image[8 + header.size() + i] = static_cast<std::byte>(i);
  return image;
}

// One tensor (a, F32, [2, 2], bytes [0, 16]) in a valid image; variations below break it one way at a time.
constexpr char kValidHeader[] = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";

// Every dtype, with a few bytes of recognisable content each.
WeightSet EveryDtypeSet() {
  WeightSet set;
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64,
                          DType::kI32, DType::kI16, DType::kI8,   DType::kU8,  DType::kBool};
  std::mt19937 rng(3);
  for (DType dtype : dtypes) {
    std::vector<int64_t> shape = {3, 5};
    auto bytes = set.AddZeros(std::string("t_") + std::string(DTypeName(dtype)), dtype, shape);
    EXPECT_TRUE(bytes.ok());
    for (std::byte& b : *bytes) b = static_cast<std::byte>(rng() & (dtype == DType::kBool ? 1 : 0x3f));
  }
  EXPECT_TRUE(set.AddZeros("scalar", DType::kF32, {}).ok());
  EXPECT_TRUE(set.AddZeros("empty", DType::kF16, {0, 7}).ok());
  set.metadata()["format"] = "pt";
  set.metadata()["note"] = "ünïcödé";
  return set;
}

void ExpectSameContent(const WeightSet& want, const WeightSet& got) {
  ASSERT_TRUE(want.CheckSameLayout(got).ok()) << want.CheckSameLayout(got).ToString();
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].data.size(), got[i].data.size());
    EXPECT_EQ(std::memcmp(want[i].data.data(), got[i].data.data(), want[i].data.size()), 0) << want[i].name;
  }
  EXPECT_EQ(want.metadata(), got.metadata());
}

std::filesystem::path TempPath(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("parsyn_st_" + std::to_string(getpid()) + "_" + name);
}

TEST(SafetensorsTest, RoundTripsEveryDtypeInMemory) {
  WeightSet set = EveryDtypeSet();
  std::vector<std::byte> image = SerializeSafetensors(set);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, image.data(), 8);
  EXPECT_EQ(header_bytes % 8, 0u) << "header is padded to 8 bytes";
  EXPECT_EQ(image.size(), 8 + header_bytes + set.total_bytes());
  auto parsed = ParseSafetensors(image);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  // The set was built in data order, which is the order the reader returns.
  ExpectSameContent(set, *parsed);
}

TEST(SafetensorsTest, ReadsTheFormatsOwnExample) {
  // Hand-written like the format's README: unpadded header, tensors listed out of data order, metadata.
  std::string header = R"({"b":{"dtype":"I8","shape":[2],"data_offsets":[4,6]},)"
                       R"("__metadata__":{"k":"v"},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";
  auto parsed = ParseSafetensors(Image(header, 6));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0].name, "a");
  EXPECT_EQ((*parsed)[1].name, "b");
  EXPECT_EQ((*parsed)[1].as<int8_t>()[1], 5);
  EXPECT_EQ(parsed->metadata().at("k"), "v");
}

TEST(SafetensorsTest, FileRoundTripIsMemoryMappedAndAtomic) {
  WeightSet set = EveryDtypeSet();
  auto path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(WriteSafetensorsFile(set, path).ok());
  // Overwriting an existing file goes through the same temp+rename.
  ASSERT_TRUE(WriteSafetensorsFile(set, path).ok());
  for (const auto& entry : std::filesystem::directory_iterator(path.parent_path())) {
    EXPECT_EQ(entry.path().string().find(path.string() + ".tmp"), std::string::npos) << "left " << entry.path();
  }
  auto read = ReadSafetensorsFile(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  std::filesystem::remove(path);  // the mapping keeps the bytes alive
  ExpectSameContent(set, *read);
  // Views into one mapping: consecutive tensors are adjacent in memory, unlike separately owned buffers.
  const Tensor& first = (*read)[0];
  const Tensor& second = (*read)[1];
  EXPECT_EQ(first.data.data() + first.data.size(), second.data.data());
  // Writes through the span stay private to the process.
  first.data[0] = std::byte{0x7f};
}

// This process's resident memory (VmRSS) in KiB.
long ResidentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// The coordinator's form for updates that wait for the round: read-only and shared, pages handed back once read.
TEST(SafetensorsTest, ReadOnlyMappingGivesItsPagesBackAndReadsThemAgain) {
  WeightSet set;
  auto bytes = set.AddZeros("w", DType::kF32, {16 << 20 >> 2});  // 16 MiB
  ASSERT_TRUE(bytes.ok());
  for (size_t i = 0; i < bytes->size(); i += 4096) (*bytes)[i] = static_cast<std::byte>(i / 4096 % 251 + 1);
  auto path = TempPath("read_only.safetensors");
  ASSERT_TRUE(WriteSafetensorsFile(set, path).ok());
  set = WeightSet();  // its own 16 MiB go now
  auto mapped = MapSafetensorsFileReadOnly(path);
  std::filesystem::remove(path);  // the mapping keeps the bytes
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ(mapped->pinned_bytes(), 0u);
  const std::span<std::byte> data = (*mapped)[0].data;
  auto touch_all = [&] {
    unsigned sum = 0;
    for (size_t i = 0; i < data.size(); i += 4096) sum += static_cast<unsigned>(data[i]);
    return sum;
  };
  const unsigned expected = touch_all();
  const long touched = ResidentKiB();
  mapped->ReleasePages();
  const long released = ResidentKiB();
  EXPECT_GT(touched - released, 12 * 1024) << "touched " << touched << " KiB, released " << released << " KiB";
  EXPECT_EQ(touch_all(), expected);  // read again from the page cache
  // A part of it: only those pages go (VmRSS is counted per thread in batches: loose bounds).
  mapped->ReleasePages(data.subspan(0, data.size() / 2));
  EXPECT_GT(ResidentKiB() - released, 4 * 1024);
  EXPECT_GT(touched - ResidentKiB(), 4 * 1024);
  EXPECT_EQ(touch_all(), expected);
  // Memory of a set that owns its bytes is left alone.
  WeightSet owned = mapped->Clone();
  EXPECT_EQ(owned.pinned_bytes(), owned.total_bytes());
  owned.ReleasePages();
  EXPECT_EQ(owned[0].data[4096], data[4096]);
}

TEST(SafetensorsTest, MisalignedTensorInFileIsCopiedAndReadCorrectly) {
  // Header of 61 bytes puts the data section at offset 69: F32 data there is not 4-byte aligned in the mapping.
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.resize(61, ' ');
  std::vector<std::byte> image = Image(header, 8);
  const float values[2] = {1.5f, -2.25f};
  std::memcpy(image.data() + 8 + header.size(), values, 8);
  auto path = TempPath("misaligned.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
  }
  auto read = ReadSafetensorsFile(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ((*read)[0].as<float>()[0], 1.5f);
  EXPECT_EQ((*read)[0].as<float>()[1], -2.25f);
}

TEST(SafetensorsTest, FileErrors) {
  auto missing = ReadSafetensorsFile(TempPath("does_not_exist"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto dir = ReadSafetensorsFile(std::filesystem::temp_directory_path());
  EXPECT_EQ(dir.status().code(), StatusCode::kInvalidArgument);
  WeightSet set;
  ASSERT_TRUE(set.AddZeros("w", DType::kF32, {2}).ok());
  Status no_dir = WriteSafetensorsFile(set, TempPath("no_such_dir") / "x.safetensors");
  EXPECT_EQ(no_dir.code(), StatusCode::kNotFound);
  // A malformed file names the path and the problem.
  auto path = TempPath("trailing.safetensors");
  std::vector<std::byte> image = Image(kValidHeader, 20);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
  }
  auto trailing = ReadSafetensorsFile(path);
  std::filesystem::remove(path);
  EXPECT_EQ(trailing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(trailing.status().message().find(path.string()), std::string::npos);
  EXPECT_NE(trailing.status().message().find("4 trailing bytes"), std::string::npos);
}

struct MalformedCase {
  const char* what;
  std::vector<std::byte> image;
  StatusCode code;
  const char* message;  // substring of the error
  SafetensorsLimits limits = {};
};

std::string Tensor1(const std::string& body) { return R"({"a":)" + body + "}"; }

// Reads an image front to back in small chunks (as a blob stream does), counting what was asked for.
class ImageReader {
 public:
  explicit ImageReader(std::span<const std::byte> image) : image_(image) {}
  ReadBytes AsReadBytes() {
    return [this](std::span<std::byte> buffer) -> StatusOr<size_t> {
      const size_t n = std::min({buffer.size(), image_.size() - offset_, size_t{7}});
      std::memcpy(buffer.data(), image_.data() + offset_, n);
      offset_ += n;
      return n;
    };
  }
  size_t bytes_read() const { return offset_; }

 private:
  std::span<const std::byte> image_;
  size_t offset_ = 0;
};

TEST(SafetensorsTest, LayoutIsCheckedFromTheHeaderAlone) {
  const std::vector<std::byte> image = SerializeSafetensors(EveryDtypeSet());
  ImageReader reader(image);
  auto layout = ReadSafetensorsLayout(image.size(), reader.AsReadBytes());
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(reader.bytes_read(), layout->data_start);  // the tensor data is never read
  auto set = ParseSafetensors(image);
  ASSERT_TRUE(set.ok());
  ASSERT_EQ(layout->tensors.size(), set->size());
  for (const SafetensorsEntry& entry : layout->tensors) {
    const Tensor* t = set->Find(entry.name);
    ASSERT_NE(t, nullptr) << entry.name;
    EXPECT_EQ(entry.dtype, t->dtype);
    EXPECT_EQ(entry.shape, t->shape);
    EXPECT_EQ(entry.end - entry.begin, t->data.size());
  }
  EXPECT_EQ(layout->metadata, set->metadata());

  // A 16 GiB tensor is checked against a 16 GiB file without reading it; one byte short is a truncated file.
  const std::string big = R"({"w":{"dtype":"F32","shape":[4294967296],"data_offsets":[0,17179869184]}})";
  const std::vector<std::byte> head = Image(big);
  const uint64_t whole = head.size() + (uint64_t{16} << 30);
  ImageReader big_reader(head);
  EXPECT_TRUE(ReadSafetensorsLayout(whole, big_reader.AsReadBytes()).ok());
  ImageReader short_reader(head);
  auto truncated = ReadSafetensorsLayout(whole - 1, short_reader.AsReadBytes());
  EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(truncated.status().message().find("run past the end of the data section"), std::string::npos);

  // A 2^62 header length is refused after the 8-byte prefix, before anything is allocated for it.
  const std::vector<std::byte> huge = Image(kValidHeader, 16, uint64_t{1} << 62);
  ImageReader huge_reader(huge);
  auto refused = ReadSafetensorsLayout(uint64_t{1} << 63, huge_reader.AsReadBytes());
  EXPECT_NE(refused.status().message().find("header length 4611686018427387904 exceeds the cap"), std::string::npos)
      << refused.status().ToString();
  EXPECT_EQ(huge_reader.bytes_read(), 8u);

  // A source that ends before the size it was said to have.
  const std::vector<std::byte> valid = Image(kValidHeader, 16);
  ImageReader cut(std::span<const std::byte>(valid).first(20));
  auto ended = ReadSafetensorsLayout(valid.size(), cut.AsReadBytes());
  EXPECT_EQ(ended.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(ended.status().message().find("before the header does"), std::string::npos) << ended.status().ToString();
}

TEST(SafetensorsTest, IndexOfAShardedCheckpointNamesEachShardsTensors) {
  auto index = ParseSafetensorsIndex(R"({"metadata": {"total_size": 48}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
      "c": "model-00001-of-00002.safetensors"}})");
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->size(), 2u);
  EXPECT_EQ(index->at("model-00001-of-00002.safetensors"), (std::vector<std::string>{"a", "c"}));
  const std::pair<const char*, const char*> bad[] = {
      {"[]", "is not a JSON object"},
      {R"({"weight_map": {}})", "non-empty 'weight_map'"},
      {R"({"weight_map": {"a": 3}})", "weight_map['a'] is not a string"},
      {R"({"weight_map": {"a": "../x.safetensors"}})", "shard name '../x.safetensors' must be a plain file name"},
      {R"({"weight_map": {"a": "sub/x.safetensors"}})", "must be a plain file name"},
  };
  for (const auto& [text, message] : bad) {
    auto parsed = ParseSafetensorsIndex(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(message), std::string::npos) << parsed.status().message();
  }
}

TEST(SafetensorsTest, RejectsMalformedImagesWithSpecificErrors) {
  const auto kInvalid = StatusCode::kInvalidArgument;
  std::vector<MalformedCase> cases = {
      {"shorter than the length prefix", std::vector<std::byte>(3), StatusCode::kDataLoss,
       "3 bytes, too short for the 8-byte header length"},
      {"header length past the end", Image(kValidHeader, 16, 4000), StatusCode::kDataLoss,
       "header length 4000 runs past the end of the file"},
      {"header length above the cap", Image(kValidHeader, 16), kInvalid, "header length 57 exceeds the cap of 32",
       SafetensorsLimits{.max_header_bytes = 32}},
      {"header length near 2^64", Image(kValidHeader, 16, ~uint64_t{0}), kInvalid, "exceeds the cap"},
      {"invalid UTF-8", Image("{\"a\xff\":{}}"), kInvalid, "header is not valid UTF-8 (byte 3 of the header)"},
      {"UTF-8 surrogate", Image("{\"\xed\xa0\x80\":{}}"), kInvalid, "not valid UTF-8"},
      {"overlong UTF-8", Image("{\"\xc0\xaf\":{}}"), kInvalid, "not valid UTF-8"},
      {"invalid JSON", Image(R"({"a": {"dtype":)"), kInvalid, "header is not valid JSON"},
      {"header not an object", Image("[1, 2]"), kInvalid, "header is not a JSON object"},
      {"duplicate tensor",
       Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
             8),
       kInvalid, "header has duplicate key 'a'"},
      {"duplicate field", Image(Tensor1(R"({"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]})"), 4),
       kInvalid, "header has duplicate key 'dtype'"},
      {"duplicate metadata key", Image(R"({"__metadata__":{"k":"1","k":"2"}})"), kInvalid,
       "header has duplicate key 'k'"},
      {"deep nesting", Image(std::string(100, '[') + std::string(100, ']')), kInvalid, "nests deeper than 8"},
      {"unknown dtype", Image(Tensor1(R"({"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]})"), 1), kInvalid,
       "tensor 'a': unknown dtype 'F8_E4M3'"},
      {"dtype not a string", Image(Tensor1(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})"), 4), kInvalid,
       "tensor 'a': dtype is not a string"},
      {"negative dim", Image(Tensor1(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"), 4), kInvalid,
       "tensor 'a': shape[0] is negative"},
      {"fractional dim", Image(Tensor1(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})"), 4), kInvalid,
       "tensor 'a': shape[0] is not an integer"},
      {"dim above int64", Image(Tensor1(R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]})"), 4),
       kInvalid, "tensor 'a': shape[0] overflows int64"},
      {"element count overflow",
       Image(Tensor1(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]})"), 4), kInvalid,
       "tensor 'a': shape [4294967296, 4294967296] overflows int64 element count"},
      {"byte size overflow", Image(Tensor1(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,4]})"), 4),
       kInvalid, "tensor 'a': shape [4611686018427387904] overflows 64-bit byte size"},
      {"shape not an array", Image(Tensor1(R"({"dtype":"F32","shape":"2x2","data_offsets":[0,16]})"), 16), kInvalid,
       "tensor 'a': shape is not an array"},
      {"entry not an object", Image(R"({"a":[1,2]})"), kInvalid, "tensor 'a': entry is not an object"},
      {"missing field", Image(Tensor1(R"({"dtype":"F32","shape":[1]})")), kInvalid,
       "tensor 'a': missing field 'data_offsets'"},
      {"unknown field", Image(Tensor1(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1})"), 4), kInvalid,
       "tensor 'a': unknown field 'x'"},
      {"offsets not a pair", Image(Tensor1(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})"), 4), kInvalid,
       "tensor 'a': data_offsets is not an array of two integers"},
      {"negative offset", Image(Tensor1(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})"), 4), kInvalid,
       "tensor 'a': data_offsets[0] is negative"},
      {"offsets reversed", Image(Tensor1(R"({"dtype":"F32","shape":[1],"data_offsets":[4,0]})"), 4), kInvalid,
       "tensor 'a': data_offsets [4, 0] end before they begin"},
      {"size mismatch", Image(Tensor1(R"({"dtype":"F32","shape":[2,2],"data_offsets":[0,12]})"), 12), kInvalid,
       "tensor 'a' (F32, shape [2, 2]) needs 16 bytes but data_offsets [0, 12] span 12"},
      {"runs past the end", Image(kValidHeader, 12), StatusCode::kDataLoss,
       "tensor 'a': data_offsets [0, 16] run past the end of the data section (12 bytes)"},
      {"trailing bytes", Image(kValidHeader, 20), kInvalid, "4 trailing bytes after the last tensor 'a'"},
      {"trailing bytes, no tensors", Image("{}", 3), kInvalid, "3 trailing bytes after the last tensor"},
      {"does not start at 0", Image(Tensor1(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), 8), kInvalid,
       "tensor 'a': data_offsets [4, 8] leave a gap: the first tensor must start at offset 0"},
      {"gap",
       Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
             12),
       kInvalid, "tensor 'b': data_offsets [8, 12] leave a gap of 4 bytes after tensor 'a'"},
      {"overlap",
       Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
             8),
       kInvalid, "tensor 'b': data_offsets [4, 8] overlap tensor 'a' [0, 8]"},
      {"tensor count above the cap",
       Image(
           R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},)"
           R"("c":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})",
           3),
       kInvalid, "header lists 3 tensors, more than the cap of 2", SafetensorsLimits{.max_tensors = 2}},
      {"metadata not an object", Image(R"({"__metadata__":["x"]})"), kInvalid, "__metadata__ is not an object"},
      {"non-string metadata", Image(R"({"__metadata__":{"epoch":3}})"), kInvalid,
       "__metadata__ value for 'epoch' is not a string"},
      {"empty tensor name", Image(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1), kInvalid,
       "tensor name is empty"},
  };
  for (const MalformedCase& c : cases) {
    auto parsed = ParseSafetensors(c.image, c.limits);
    ASSERT_FALSE(parsed.ok()) << c.what;
    EXPECT_EQ(parsed.status().code(), c.code) << c.what << ": " << parsed.status().ToString();
    EXPECT_NE(parsed.status().message().find(c.message), std::string::npos)
        << c.what << ": got \"" << parsed.status().message() << "\", want it to contain \"" << c.message << "\"";
    // The header-only check gives the same verdict from the header alone.
    ImageReader reader(c.image);
    auto layout = ReadSafetensorsLayout(c.image.size(), reader.AsReadBytes(), c.limits);
    ASSERT_FALSE(layout.ok()) << c.what;
    EXPECT_EQ(layout.status().ToString(), parsed.status().ToString()) << c.what;
  }
  // Sanity: the valid base image used above parses.
  EXPECT_TRUE(ParseSafetensors(Image(kValidHeader, 16)).ok());
}

TEST(SafetensorsTest, EveryTruncationOfAValidImageIsRejectedCleanly) {
  std::vector<std::byte> image = SerializeSafetensors(EveryDtypeSet());
  for (size_t length = 0; length < image.size(); ++length) {
    auto parsed = ParseSafetensors(std::span<const std::byte>(image.data(), length));
    ASSERT_FALSE(parsed.ok()) << length;
  }
}

}  // namespace
}  // namespace parsyn::weights
