#include "serialization/safetensors.h"

#include <cstring>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace strata::serialization {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

HostTensor make_tensor(DType dtype, Shape shape, uint8_t seed) {
  HostTensor t = HostTensor::zeros(TensorType{dtype, std::move(shape)});
  auto *bytes = reinterpret_cast<uint8_t *>(t.data());
  for (size_t i = 0; i < t.size_bytes(); ++i)
    bytes[i] = dtype == DType::kBool ? (i + seed) % 2 : static_cast<uint8_t>(i * 13 + seed);
  return t;
}

std::map<std::string, HostTensor> sample_tensors() {
  std::map<std::string, HostTensor> tensors;
  tensors.emplace("layer.weight", make_tensor(DType::kF32, {3, 5}, 1));
  tensors.emplace("layer.bias", make_tensor(DType::kF16, {3}, 2));
  tensors.emplace("emb", make_tensor(DType::kBF16, {2, 2}, 3));
  tensors.emplace("ids", make_tensor(DType::kI64, {4}, 4));
  tensors.emplace("count", make_tensor(DType::kI32, {}, 5));
  tensors.emplace("mask", make_tensor(DType::kBool, {7}, 6));
  tensors.emplace("empty", make_tensor(DType::kF32, {0, 3}, 7));
  return tensors;
}

std::vector<uint8_t> read_bytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string &path, const std::vector<uint8_t> &bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char *>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A file with the given JSON header (padded as needed) and `data_bytes` zero bytes.
std::vector<uint8_t> file_with_header(std::string header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

TEST(Safetensors, RoundTripsEveryDType) {
  TempDir dir;
  auto tensors = sample_tensors();
  ASSERT_TRUE(write_safetensors(dir.file("w.safetensors"), tensors).is_ok());
  auto back = read_safetensors(dir.file("w.safetensors"));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  ASSERT_EQ(back->size(), tensors.size());
  for (const auto &[name, tensor] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(back->count(name));
    EXPECT_EQ(back->at(name).type, tensor.type);
    EXPECT_EQ(back->at(name).blob->bytes(), tensor.blob->bytes());
    auto one = read_safetensors_tensor(dir.file("w.safetensors"), name, tensor.type);
    ASSERT_TRUE(one.is_ok()) << one.status().to_string();
    EXPECT_EQ(one->blob->bytes(), tensor.blob->bytes());
  }
}

TEST(Safetensors, LayoutIsDeterministicAndAligned) {
  TempDir dir;
  ASSERT_TRUE(write_safetensors(dir.file("a.safetensors"), sample_tensors()).is_ok());
  ASSERT_TRUE(write_safetensors(dir.file("b.safetensors"), sample_tensors()).is_ok());
  std::vector<uint8_t> a = read_bytes(dir.file("a.safetensors"));
  EXPECT_EQ(a, read_bytes(dir.file("b.safetensors")));
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i)
    header |= static_cast<uint64_t>(a[i]) << (8 * i);
  EXPECT_EQ((8 + header) % 8, 0u);
  std::string text(a.begin() + 8, a.begin() + 8 + static_cast<ptrdiff_t>(header));
  // Sorted by name: "count" comes first in the data section.
  EXPECT_THAT(text, HasSubstr(R"("count":{"data_offsets":[0,4])"));
  EXPECT_THAT(text, HasSubstr(R"("dtype":"BF16")"));
}

TEST(Safetensors, ReadingOneTensorChecksItsType) {
  TempDir dir;
  ASSERT_TRUE(write_safetensors(dir.file("w.safetensors"), sample_tensors()).is_ok());
  auto wrong_dtype =
      read_safetensors_tensor(dir.file("w.safetensors"), "ids", TensorType{DType::kI32, {4}});
  ASSERT_FALSE(wrong_dtype.is_ok());
  EXPECT_THAT(wrong_dtype.status().message(),
              HasSubstr("tensor 'ids' is stored as i64[4] but i32[4] is expected"));
  auto wrong_shape =
      read_safetensors_tensor(dir.file("w.safetensors"), "ids", TensorType{DType::kI64, {2, 2}});
  ASSERT_FALSE(wrong_shape.is_ok());
  auto missing =
      read_safetensors_tensor(dir.file("w.safetensors"), "nope", TensorType{DType::kF32, {}});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no tensor 'nope'"));
  auto metadata = read_safetensors_tensor(dir.file("w.safetensors"), "__metadata__",
                                          TensorType{DType::kF32, {}});
  ASSERT_FALSE(metadata.is_ok());
}

TEST(Safetensors, MalformedFilesGiveClearErrors) {
  TempDir dir;
  struct Case {
    const char *name;
    std::vector<uint8_t> bytes;
    const char *expected;
  };
  std::vector<uint8_t> huge_length(16, 0);
  huge_length[7] = 0x10; // 2^60
  std::vector<uint8_t> past_end = file_with_header("{}", 0);
  past_end[0] = 200;
  const std::string f32 = R"("dtype":"F32","shape":[2])";
  std::vector<Case> cases = {
      {"empty", {}, "8-byte header length"},
      {"huge header length", huge_length, "more than the limit"},
      {"header past the end", past_end, "runs past the end"},
      {"not json", file_with_header("{not json", 0), "not valid JSON"},
      {"not an object", file_with_header("[1, 2]", 0), "not a JSON object"},
      {"bad dtype",
       file_with_header(R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8),
       "field dtype 'F64' is not supported"},
      {"missing dtype", file_with_header(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4),
       "field dtype is missing"},
      {"negative dim",
       file_with_header(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0),
       "negative"},
      {"overflowing shape",
       file_with_header(
           R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
       "2^53"},
      {"size mismatch", file_with_header("{\"t\":{" + f32 + ",\"data_offsets\":[0,4]}}", 8),
       "tensor 't': field data_offsets spans 4 bytes but f32[2] needs 8"},
      {"offsets past the data",
       file_with_header("{\"t\":{" + f32 + ",\"data_offsets\":[8,16]}}", 8),
       "outside the data section"},
      {"reversed offsets", file_with_header("{\"t\":{" + f32 + ",\"data_offsets\":[8,0]}}", 8),
       "outside the data section"},
      {"negative offsets", file_with_header("{\"t\":{" + f32 + ",\"data_offsets\":[-8,0]}}", 8),
       "not a pair of non-negative integers"},
      {"entry not an object", file_with_header(R"({"t": 3})", 0), "not a JSON object"},
      {"metadata not an object", file_with_header(R"({"__metadata__": 3})", 0),
       "__metadata__ is not an object"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = dir.file("bad.safetensors");
    write_bytes(path, c.bytes);
    auto all = read_safetensors(path);
    ASSERT_FALSE(all.is_ok());
    EXPECT_THAT(all.status().message(), HasSubstr(path));
    EXPECT_THAT(all.status().message(), HasSubstr(c.expected));
  }
}

// The tensors' data_offsets must cover the data section exactly: a byte no
// tensor owns (a header length one short, bytes appended, a gap between two
// tensors) means the file is not what its header says, and tensors must not
// share bytes. Each is refused naming the file and the range.
TEST(Safetensors, DataNotCoveredByTheTensorsIsRefused) {
  TempDir dir;
  const std::string f32 = R"("dtype":"F32","shape":[2])";
  // Two spaces of padding keep the JSON whole when the length is one short.
  std::vector<uint8_t> one_short =
      file_with_header("{\"t\":{" + f32 + ",\"data_offsets\":[0,8]}}  ", 8);
  --one_short[0];
  const size_t data_start = 8 + (one_short.size() - 8 - 8) - 1;
  struct Case {
    const char *name;
    std::vector<uint8_t> bytes;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"trailing bytes",
       file_with_header("{\"t\":{" + f32 + ",\"data_offsets\":[0,8]}}", 12),
       {"data bytes [8, 12)", "belong to no tensor", "after the last tensor"}},
      {"header length one short",
       one_short,
       {"data bytes [8, 9)",
        str_cat("(file offsets [", data_start + 8, ", ", data_start + 9, "))")}},
      {"a gap between tensors",
       file_with_header("{\"a\":{" + f32 + ",\"data_offsets\":[0,8]},\"b\":{" + f32 +
                            ",\"data_offsets\":[12,20]}}",
                        20),
       {"data bytes [8, 12)", "before tensor 'b'"}},
      {"a gap before the first tensor",
       file_with_header("{\"t\":{" + f32 + ",\"data_offsets\":[4,12]}}", 12),
       {"data bytes [0, 4)", "before tensor 't'"}},
      {"tensors sharing bytes",
       file_with_header("{\"a\":{" + f32 + ",\"data_offsets\":[0,8]},\"b\":{" + f32 +
                            ",\"data_offsets\":[4,12]}}",
                        12),
       {"tensor 'b' at data_offsets [4, 12] overlaps tensor 'a', which ends at 8"}},
      {"no tensors but data", file_with_header("{}", 8), {"data bytes [0, 8)"}},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file("bad.safetensors");
    write_bytes(path, c.bytes);
    auto all = read_safetensors(path);
    ASSERT_FALSE(all.is_ok());
    EXPECT_THAT(all.status().message(), HasSubstr(path));
    for (const std::string &part : c.expected)
      EXPECT_THAT(all.status().message(), HasSubstr(part));
    auto one = read_safetensors_tensor(path, "t", TensorType{DType::kF32, {2}});
    ASSERT_FALSE(one.is_ok());
    EXPECT_EQ(one.status().message(), all.status().message());
  }
  // Covered exactly, with a zero-size tensor between two others: accepted.
  write_bytes(dir.file("good.safetensors"),
              file_with_header("{\"a\":{" + f32 +
                                   ",\"data_offsets\":[0,8]},\"e\":{\"dtype\":"
                                   "\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},\"t\":{" +
                                   f32 + ",\"data_offsets\":[8,16]}}",
                               16));
  auto good = read_safetensors(dir.file("good.safetensors"));
  ASSERT_TRUE(good.is_ok()) << good.status().to_string();
  EXPECT_EQ(good->size(), 3u);
  EXPECT_TRUE(
      read_safetensors_tensor(dir.file("good.safetensors"), "t", TensorType{DType::kF32, {2}})
          .is_ok());
}

TEST(Safetensors, EveryTruncationIsAnError) {
  TempDir dir;
  std::map<std::string, HostTensor> tensors;
  tensors.emplace("a", make_tensor(DType::kF32, {2}, 1));
  tensors.emplace("b", make_tensor(DType::kI32, {3}, 2));
  ASSERT_TRUE(write_safetensors(dir.file("w.safetensors"), tensors).is_ok());
  std::vector<uint8_t> good = read_bytes(dir.file("w.safetensors"));
  for (size_t length = 0; length < good.size(); ++length) {
    write_bytes(dir.file("t.safetensors"),
                std::vector<uint8_t>(good.begin(), good.begin() + static_cast<ptrdiff_t>(length)));
    EXPECT_FALSE(read_safetensors(dir.file("t.safetensors")).is_ok()) << length;
  }
}

TEST(Safetensors, EveryByteFlipIsAnErrorOrWellFormed) {
  TempDir dir;
  std::map<std::string, HostTensor> tensors;
  tensors.emplace("a", make_tensor(DType::kF32, {2}, 1));
  tensors.emplace("b", make_tensor(DType::kI64, {1}, 2));
  ASSERT_TRUE(write_safetensors(dir.file("w.safetensors"), tensors).is_ok());
  std::vector<uint8_t> good = read_bytes(dir.file("w.safetensors"));
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<uint8_t> corrupt = good;
    corrupt[i] ^= 0xff;
    write_bytes(dir.file("f.safetensors"), corrupt);
    auto all = read_safetensors(dir.file("f.safetensors"));
    if (!all.is_ok()) continue;
    for (const auto &[name, t] : *all) {
      EXPECT_EQ(static_cast<int64_t>(t.size_bytes()), t.type.size_bytes());
    }
  }
}

TEST(Safetensors, PythonReadsWhatStrataWrites) {
  if (!testing::python_has("numpy")) GTEST_SKIP() << "/usr/bin/python3 has no numpy";
  TempDir dir;
  std::map<std::string, HostTensor> tensors;
  HostTensor w = HostTensor::zeros(TensorType{DType::kF32, {2, 3}});
  for (int i = 0; i < 6; ++i)
    w.as<float>()[i] = 0.5f * static_cast<float>(i);
  HostTensor ids = HostTensor::zeros(TensorType{DType::kI64, {2}});
  ids.as<int64_t>()[1] = -7;
  tensors.emplace("w", w);
  tensors.emplace("ids", ids);
  ASSERT_TRUE(write_safetensors(dir.file("m.safetensors"), tensors).is_ok());
  // An independent reader of the format: struct for the length, json for the
  // header, numpy for the data.
  std::string script =
      "import json, struct, numpy as np\n"
      "raw = open('" +
      dir.file("m.safetensors") +
      "', 'rb').read()\n"
      "(n,) = struct.unpack('<Q', raw[:8])\n"
      "assert (8 + n) % 8 == 0\n"
      "header = json.loads(raw[8:8 + n])\n"
      "data = raw[8 + n:]\n"
      "types = {'F32': '<f4', 'I64': '<i8'}\n"
      "def get(k):\n"
      "    e = header[k]\n"
      "    b, end = e['data_offsets']\n"
      "    return np.frombuffer(data[b:end], types[e['dtype']]).reshape(e['shape'])\n"
      "assert (get('w') == np.arange(6, dtype='f4').reshape(2, 3) * 0.5).all()\n"
      "assert get('ids').tolist() == [0, -7]\n"
      "assert header['__metadata__'] == {'format': 'pt'}\n"
      "print('ok')\n";
  std::string output;
  EXPECT_EQ(testing::run_python(script, &output), 0) << output;
  EXPECT_THAT(output, HasSubstr("ok"));
}

TEST(Safetensors, ReadsAFileWrittenByPython) {
  if (!testing::python_has("numpy")) GTEST_SKIP() << "/usr/bin/python3 has no numpy";
  TempDir dir;
  // Written the way the reference implementation lays files out.
  std::string script =
      "import json, struct, numpy as np\n"
      "a = np.arange(4, dtype='<f4') - 1\n"
      "h = json.dumps({'a': {'dtype': 'F32', 'shape': [2, 2], 'data_offsets': [0, 16]},\n"
      "                '__metadata__': {'source': 'python'}}).encode()\n"
      "open('" +
      dir.file("p.safetensors") + "', 'wb').write(struct.pack('<Q', len(h)) + h + a.tobytes())\n";
  std::string output;
  ASSERT_EQ(testing::run_python(script, &output), 0) << output;
  auto a = read_safetensors_tensor(dir.file("p.safetensors"), "a", TensorType{DType::kF32, {2, 2}});
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->as<float>()[0], -1.0f);
  EXPECT_EQ(a->as<float>()[3], 2.0f);
}

} // namespace
} // namespace strata::serialization
