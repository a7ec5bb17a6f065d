// .npy: save_npy → load_npy round trips, the dtypes and versions NumPy writes, and damaged files
// rejected with an Error that names the file (the shapes of fuzz/corpus/fuzz_npy/).
#include "lineage/io/npy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "lineage/core/error.h"
#include "test_support.h"

namespace lineage::io {
namespace npy_test {
namespace {

namespace fs = std::filesystem;

// A .npy file as NumPy writes it: magic, version, header length, the dict padded to 64, the data.
std::string npy(const std::string& dict, const std::string& data, int version = 1) {
  const size_t prefix = version == 1 ? 10 : 12;
  std::string header = dict;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(version);
  out += '\0';
  const uint32_t len = uint32_t(header.size());
  out.append(reinterpret_cast<const char*>(&len), version == 1 ? 2 : 4);
  return out + header + data;
}

std::string floats(std::initializer_list<float> v) {
  return std::string(reinterpret_cast<const char*>(v.begin()), v.size() * sizeof(float));
}

TEST(Npy, SaveLoadRoundTripsEveryRank) {
  const fs::path dir = test::temp_dir();
  const float data[6] = {0.5f, -1.0f, 2.0f, 3.25f, -0.0f, 1e30f};
  for (const Shape& shape : {Shape{}, Shape{6}, Shape{2, 3}, Shape{1, 2, 3}, Shape{0, 4}}) {
    SCOPED_TRACE(shape_str(shape));
    save_npy(dir / "a.npy", data, shape);
    const Tensor t = load_npy(dir / "a.npy");
    EXPECT_EQ(t.dtype(), DType::F32);
    EXPECT_EQ(t.shape(), shape);
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(t.raw(), data, t.nbytes()), 0);
    }
  }
}

TEST(Npy, ReadsTheDtypesAndVersionsNumPyWrites) {
  const fs::path dir = test::temp_dir();
  const int64_t ints[2] = {-1, int64_t(1) << 40};
  test::write_text(dir / "i8.npy", npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                                       std::string(reinterpret_cast<const char*>(ints), 16), 2));
  const Tensor i8 = load_npy(dir / "i8.npy");
  ASSERT_EQ(i8.dtype(), DType::I64);
  EXPECT_EQ(i8.data<int64_t>()[1], int64_t(1) << 40);
  const double d[2] = {1.5, -2.0};
  test::write_text(dir / "f8.npy", npy("{\"descr\": \"<f8\", \"shape\": (1, 2), \"fortran_order\": False}",
                                       std::string(reinterpret_cast<const char*>(d), 16), 3));
  const Tensor f8 = load_npy(dir / "f8.npy");
  ASSERT_EQ(f8.dtype(), DType::F32);  // narrowed
  EXPECT_EQ(f8.shape(), (Shape{1, 2}));
  EXPECT_EQ(f8.data<float>()[1], -2.0f);
}

TEST(Npy, DamagedFilesAreErrorsNamingTheFile) {
  const fs::path dir = test::temp_dir();
  const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const std::pair<std::string, std::string> cases[] = {
      {"", "not a .npy file"},
      {"\x93NUMPX" + npy(good, floats({1, 2})).substr(6), "not a .npy file"},
      {npy(good, floats({1, 2})).substr(0, 9), "not a .npy file"},
      {npy(good, floats({1, 2})).replace(6, 1, "\x07"), "version 7"},
      {npy(good, floats({1, 2})).replace(8, 2, "\xff\xff"), "runs past the end"},
      {npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", floats({1, 2})), "a non-negative integer"},
      {npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", floats({1, 2})), "a non-negative integer"},
      {npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", ""), "overflows int64"},
      {npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", ""), "more bytes than"},
      {npy("{'descr': '<f4', 'fortran_order': False, }", ""), "all three"},
      {npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", floats({1, 2})), "twice"},
      {npy("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", floats({1, 2})), "True or False"},
      {npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", floats({1, 2})), "key 'x'"},
      {npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk", floats({1, 2})), "after the closing"},
      {npy("{'descr': '<f4, 'fortran_order': False, 'shape': (2,), }", floats({1, 2})), "npy header"},
      {npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", floats({1, 2})), "Fortran order"},
      {npy("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }", "abcd"), "dtype '<f2'"},
      {npy(good, floats({1})), "needs 8 bytes but the file holds 4"},
      {npy(good, floats({1, 2, 3})), "needs 8 bytes but the file holds 12"},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    const auto& [bytes, needle] = cases[i];
    SCOPED_TRACE(i);
    const fs::path p = dir / ("bad" + std::to_string(i) + ".npy");
    test::write_text(p, bytes);
    try {
      load_npy(p);
      ADD_FAILURE() << "accepted; expected an error with \"" << needle << "\"";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what() << "\nlacks: " << needle;
    }
  }
  EXPECT_THROW(load_npy(dir / "missing.npy"), Error);
  EXPECT_THROW(load_npy(dir), Error);  // a directory
}

}  // namespace
}  // namespace npy_test
}  // namespace lineage::io
