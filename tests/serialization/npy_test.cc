#include "serialization/npy.h"

#include <cstring>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace strata::serialization {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

HostTensor make_tensor(DType dtype, Shape shape) {
  HostTensor t = HostTensor::zeros(TensorType{dtype, std::move(shape)});
  auto *bytes = reinterpret_cast<uint8_t *>(t.data());
  for (size_t i = 0; i < t.size_bytes(); ++i)
    bytes[i] = dtype == DType::kBool ? (i % 3 == 0) : static_cast<uint8_t>(i * 7 + 1);
  return t;
}

std::vector<uint8_t> bytes_of(const std::string &header_dict, size_t data_bytes,
                              uint8_t major = 1) {
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', major, 0};
  std::string header = header_dict + "\n";
  if (major == 1) {
    out.push_back(static_cast<uint8_t>(header.size()));
    out.push_back(static_cast<uint8_t>(header.size() >> 8));
  } else {
    for (int i = 0; i < 4; ++i)
      out.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  }
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

TEST(Npy, RoundTripsEverySupportedDType) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kI32, DType::kI64, DType::kBool}) {
    for (Shape shape : {Shape{}, Shape{5}, Shape{2, 3}, Shape{2, 0, 4}}) {
      SCOPED_TRACE((TensorType{dtype, shape}.to_string()));
      HostTensor t = make_tensor(dtype, shape);
      std::vector<uint8_t> bytes = npy_bytes(t);
      // Data starts 64-byte aligned, as NumPy writes it.
      EXPECT_EQ((bytes.size() - t.size_bytes()) % 64, 0u);
      auto back = parse_npy(bytes, "t.npy");
      ASSERT_TRUE(back.is_ok()) << back.status().to_string();
      EXPECT_EQ(back->type, t.type);
      EXPECT_EQ(back->blob->bytes(), t.blob->bytes());
    }
  }
}

TEST(Npy, ReadsVersionsTwoAndThree) {
  for (uint8_t major : {uint8_t{2}, uint8_t{3}}) {
    auto bytes = bytes_of("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", 12, major);
    auto t = parse_npy(bytes, "v.npy");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_EQ(t->type, (TensorType{DType::kI32, {3}}));
  }
}

TEST(Npy, AcceptsKeysInAnyOrderAndDoubleQuotes) {
  auto bytes = bytes_of(R"({"shape": (2, 2), "fortran_order": False, "descr": "<f2"})", 8);
  auto t = parse_npy(bytes, "q.npy");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->type, (TensorType{DType::kF16, {2, 2}}));
}

TEST(Npy, RefusesBf16WhenWriting) {
  TempDir dir;
  Status status = write_npy(dir.file("b.npy"), make_tensor(DType::kBF16, {2}));
  ASSERT_FALSE(status.is_ok());
  EXPECT_THAT(status.message(), HasSubstr("bf16"));
}

struct BadCase {
  const char *name;
  std::vector<uint8_t> bytes;
  const char *expected;
};

TEST(Npy, MalformedFilesGiveClearErrors) {
  std::vector<uint8_t> good = npy_bytes(make_tensor(DType::kF32, {2, 3}));
  std::vector<uint8_t> bad_magic = good;
  bad_magic[1] = 'X';
  std::vector<uint8_t> bad_version = good;
  bad_version[6] = 9;
  std::vector<uint8_t> long_header = good;
  long_header[8] = 0xff;
  long_header[9] = 0xff;
  std::vector<uint8_t> truncated_data(good.begin(), good.end() - 1);
  std::vector<uint8_t> extra_data = good;
  extra_data.push_back(0);
  const std::string order = "'fortran_order': False, ";
  std::vector<BadCase> cases = {
      {"empty", {}, "bad magic"},
      {"bad magic", bad_magic, "bad magic"},
      {"bad version", bad_version, "version 9.0"},
      {"header past the end", long_header, "runs past the end"},
      {"truncated data", truncated_data, "the data has 23 bytes but f32[2, 3] needs 24"},
      {"extra data", extra_data, "the data has 25 bytes"},
      {"big-endian", bytes_of("{'descr': '>f4', " + order + "'shape': (1,), }", 4), "big-endian"},
      {"float64", bytes_of("{'descr': '<f8', " + order + "'shape': (1,), }", 8),
       "field descr '<f8' is not supported"},
      {"fortran order", bytes_of("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16),
       "fortran_order is True"},
      {"negative dim", bytes_of("{'descr': '<f4', " + order + "'shape': (-1,), }", 0),
       "not a non-negative integer"},
      {"huge dims",
       bytes_of("{'descr': '<f4', " + order + "'shape': (4294967296, 4294967296), }", 0), "2^53"},
      {"giant dim",
       bytes_of("{'descr': '<f4', " + order + "'shape': (99999999999999999999999,), }", 0),
       "too large"},
      {"missing shape", bytes_of("{'descr': '<f4', 'fortran_order': False, }", 0),
       "no field shape"},
      {"unknown key", bytes_of("{'descr': '<f4', 'colour': 'red', }", 0), "unexpected key"},
      {"not a dict", bytes_of("['descr']", 0), "expected '{'"},
      {"unterminated", bytes_of("{'descr': '<f4", 0), "unterminated"},
  };
  for (const BadCase &c : cases) {
    SCOPED_TRACE(c.name);
    auto t = parse_npy(c.bytes, "bad.npy");
    ASSERT_FALSE(t.is_ok());
    EXPECT_THAT(t.status().message(), HasSubstr("bad.npy"));
    EXPECT_THAT(t.status().message(), HasSubstr(c.expected));
  }
}

TEST(Npy, EveryTruncationIsAnError) {
  std::vector<uint8_t> good = npy_bytes(make_tensor(DType::kI64, {3}));
  for (size_t length = 0; length < good.size(); ++length) {
    std::vector<uint8_t> prefix(good.begin(), good.begin() + static_cast<ptrdiff_t>(length));
    EXPECT_FALSE(parse_npy(prefix, "t.npy").is_ok()) << length;
  }
}

TEST(Npy, EveryByteFlipIsAnErrorOrAWellFormedTensor) {
  std::vector<uint8_t> good = npy_bytes(make_tensor(DType::kF32, {2, 2}));
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<uint8_t> corrupt = good;
    corrupt[i] ^= 0xff;
    auto t = parse_npy(corrupt, "t.npy");
    if (t.is_ok()) {
      EXPECT_EQ(static_cast<int64_t>(t->size_bytes()), t->type.size_bytes());
    }
  }
}

TEST(Npy, ReadsWhatNumPyWrites) {
  if (!testing::python_has("numpy")) GTEST_SKIP() << "/usr/bin/python3 has no numpy";
  TempDir dir;
  std::string script = "import numpy as np\n"
                       "d = '" +
                       dir.path().string() +
                       "'\n"
                       "np.save(d + '/f32.npy', np.arange(6, dtype='<f4').reshape(2, 3) / 4)\n"
                       "np.save(d + '/f16.npy', np.array([1.5, -2], dtype='<f2'))\n"
                       "np.save(d + '/i64.npy', np.array([[1, -2], [3, 1 << 40]], dtype='<i8'))\n"
                       "np.save(d + '/i32.npy', np.array(7, dtype='<i4'))\n"
                       "np.save(d + '/b.npy', np.array([True, False, True]))\n"
                       "np.save(d + '/fortran.npy', np.asfortranarray(np.ones((2, 3), 'f4')))\n"
                       "np.save(d + '/f64.npy', np.ones(2))\n";
  std::string output;
  ASSERT_EQ(testing::run_python(script, &output), 0) << output;

  auto f32 = read_npy(dir.file("f32.npy"));
  ASSERT_TRUE(f32.is_ok()) << f32.status().to_string();
  EXPECT_EQ(f32->type, (TensorType{DType::kF32, {2, 3}}));
  EXPECT_EQ(f32->as<float>()[5], 1.25f);
  auto f16 = read_npy(dir.file("f16.npy"));
  ASSERT_TRUE(f16.is_ok()) << f16.status().to_string();
  EXPECT_EQ(f16_to_float(f16->as<uint16_t>()[0]), 1.5f);
  auto i64 = read_npy(dir.file("i64.npy"));
  ASSERT_TRUE(i64.is_ok()) << i64.status().to_string();
  EXPECT_EQ(i64->as<int64_t>()[3], int64_t{1} << 40);
  auto i32 = read_npy(dir.file("i32.npy"));
  ASSERT_TRUE(i32.is_ok()) << i32.status().to_string();
  EXPECT_EQ(i32->type, (TensorType{DType::kI32, {}}));
  EXPECT_EQ(i32->as<int32_t>()[0], 7);
  auto b = read_npy(dir.file("b.npy"));
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->type, (TensorType{DType::kBool, {3}}));
  EXPECT_EQ(b->as<uint8_t>()[1], 0);
  EXPECT_EQ(b->as<uint8_t>()[2], 1);

  auto fortran = read_npy(dir.file("fortran.npy"));
  ASSERT_FALSE(fortran.is_ok());
  EXPECT_THAT(fortran.status().message(), HasSubstr("fortran.npy"));
  EXPECT_THAT(fortran.status().message(), HasSubstr("fortran_order"));
  auto f64 = read_npy(dir.file("f64.npy"));
  ASSERT_FALSE(f64.is_ok());
  EXPECT_THAT(f64.status().message(), HasSubstr("'<f8'"));
}

TEST(Npy, NumPyReadsWhatStrataWrites) {
  if (!testing::python_has("numpy")) GTEST_SKIP() << "/usr/bin/python3 has no numpy";
  TempDir dir;
  HostTensor f32 = HostTensor::zeros(TensorType{DType::kF32, {2, 3}});
  for (int i = 0; i < 6; ++i)
    f32.as<float>()[i] = static_cast<float>(i) - 2.5f;
  HostTensor i64 = HostTensor::zeros(TensorType{DType::kI64, {4}});
  i64.as<int64_t>()[3] = -(int64_t{1} << 40);
  HostTensor scalar = HostTensor::zeros(TensorType{DType::kF16, {}});
  scalar.as<uint16_t>()[0] = float_to_f16(0.5f);
  HostTensor flags = make_tensor(DType::kBool, {1, 4});
  ASSERT_TRUE(write_npy(dir.file("f32.npy"), f32).is_ok());
  ASSERT_TRUE(write_npy(dir.file("i64.npy"), i64).is_ok());
  ASSERT_TRUE(write_npy(dir.file("f16.npy"), scalar).is_ok());
  ASSERT_TRUE(write_npy(dir.file("b.npy"), flags).is_ok());
  std::string script =
      "import numpy as np\n"
      "d = '" +
      dir.path().string() +
      "'\n"
      "a = np.load(d + '/f32.npy')\n"
      "assert a.dtype == np.float32 and a.shape == (2, 3), (a.dtype, a.shape)\n"
      "assert (a == np.arange(6, dtype='f4').reshape(2, 3) - 2.5).all(), a\n"
      "b = np.load(d + '/i64.npy')\n"
      "assert b.dtype == np.int64 and b.tolist() == [0, 0, 0, -(1 << 40)], b\n"
      "c = np.load(d + '/f16.npy')\n"
      "assert c.dtype == np.float16 and c.shape == () and c == 0.5, c\n"
      "e = np.load(d + '/b.npy')\n"
      "assert e.dtype == np.bool_ and e.tolist() == [[True, False, False, True]], e\n"
      "print('ok')\n";
  std::string output;
  EXPECT_EQ(testing::run_python(script, &output), 0) << output;
  EXPECT_THAT(output, HasSubstr("ok"));
}

} // namespace
} // namespace strata::serialization
