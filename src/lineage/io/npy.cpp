#include "lineage/io/npy.h"

#include <cstring>
#include <fstream>
#include <memory>
#include <string_view>
#include <utility>

#include "lineage/core/checked.h"
#include "lineage/core/error.h"
#include "lineage/core/json_read.h"
#include "lineage/io/mapping_guard.h"

namespace lineage::io {

namespace {

// The bytes before a float32 array of `shape`: magic, version 1.0, the header padded to 64 bytes.
std::string f32_header(const Shape& shape) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const uint16_t len = uint16_t(header.size());
  return std::string("\x93NUMPY\x01\x00", 8) + char(len & 0xFF) + char(len >> 8) + header;
}

}  // namespace

void save_npy(const std::filesystem::path& path, const float* data, const Shape& shape) {
  NpyWriter out(path, shape);
  out.write(data, shape_numel(shape));
  out.close();
}

NpyWriter::NpyWriter(const std::filesystem::path& path, const Shape& shape)
    : path_(path), out_(path, std::ios::binary), total_(shape_numel(shape)) {
  if (!out_) throw Error(cat(path.string(), ": cannot open for writing"));
  out_ << f32_header(shape);
}

void NpyWriter::write(const float* data, int64_t n) {
  if (written_ + n > total_) throw Error(cat(path_.string(), ": more values written than its shape holds"));
  out_.write(reinterpret_cast<const char*>(data), std::streamsize(n * 4));
  written_ += n;
  if (!out_) throw Error(cat(path_.string(), ": write failed"));
}

void NpyWriter::close() {
  if (written_ != total_)
    throw Error(cat(path_.string(), ": ", written_, " values written, its shape holds ", total_));
  out_.close();
  if (!out_) throw Error(cat(path_.string(), ": write failed"));
}

namespace {

// The header of a .npy file: a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// read strictly (the three keys once each, nothing else), so a damaged file is an Error naming it.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

class HeaderReader {
 public:
  HeaderReader(std::string_view text, const std::string& file) : s_(text), file_(file) {}

  NpyHeader read() {
    NpyHeader h;
    bool seen[3] = {false, false, false};
    expect('{');
    while (!peek('}')) {
      const std::string key = quoted();
      expect(':');
      const int k = key == "descr" ? 0 : key == "fortran_order" ? 1 : key == "shape" ? 2 : -1;
      if (k < 0) fail(cat("key '", key, "'"), "only 'descr', 'fortran_order' and 'shape'");
      if (seen[k]) fail(cat("key '", key, "' twice"), "each key once");
      seen[k] = true;
      if (k == 0) h.descr = quoted();
      if (k == 1) h.fortran_order = boolean();
      if (k == 2) h.shape = tuple();
      if (!peek(',')) break;
      expect(',');
    }
    expect('}');
    skip_space();
    if (i_ != s_.size()) fail("text after the closing '}'", "only spaces and a newline");
    if (!seen[0] || !seen[1] || !seen[2]) fail("a header without 'descr', 'fortran_order' or 'shape'", "all three");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& found, const std::string& expected) const {
    throw Error(cat(file_, ": .npy header at byte ", i_, ": found ", found, "; expected ", expected));
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool peek(char c) {
    skip_space();
    return i_ < s_.size() && s_[i_] == c;
  }
  void expect(char c) {
    if (!peek(c)) fail(i_ < s_.size() ? cat("'", s_[i_], "'") : std::string("the end"), cat("'", c, "'"));
    ++i_;
  }
  std::string quoted() {
    skip_space();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) fail("no quoted string", "a quoted key or descr");
    const char q = s_[i_++];
    const size_t end = s_.find(q, i_);
    if (end == std::string_view::npos) fail("an unterminated string", "a closing quote");
    std::string out(s_.substr(i_, end - i_));
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair<std::string_view, bool>{"True", true}, {"False", false}}) {
      if (s_.substr(i_, word.size()) == word) {
        i_ += word.size();
        return value;
      }
    }
    fail("no True or False", "True or False");
  }
  Shape tuple() {
    Shape shape;
    expect('(');
    while (!peek(')')) {
      int64_t d = 0;
      const size_t first = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        const auto times10 = checked_mul(d, 10);
        const auto next = times10 ? checked_add(*times10, s_[i_] - '0') : std::nullopt;
        if (!next) fail("a dimension that overflows int64", "a size");
        d = *next;
        ++i_;
      }
      if (i_ == first) fail("no dimension", "a non-negative integer");
      shape.push_back(d);
      if (!peek(',')) break;
      expect(',');
    }
    expect(')');
    return shape;
  }

  std::string_view s_;
  const std::string& file_;
  size_t i_ = 0;
};

uint32_t little_endian(std::string_view bytes, size_t at, int n) {
  uint32_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | uint8_t(bytes[at + size_t(k)]);
  return v;
}

struct NpyLayout {
  DType dtype;
  Shape shape;
  size_t data_at;
};

// The header of the .npy bytes `bytes` (file `f`), checked against its data's length.
NpyLayout parse_npy(std::string_view bytes, const std::string& f) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    throw Error(cat(f, ": not a .npy file (expected the magic \\x93NUMPY and a version)"));
  const int major = uint8_t(bytes[6]);
  if (major < 1 || major > 3) throw Error(cat(f, ": .npy format version ", major, " is not supported; expected 1, 2 or 3"));
  const int len_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < size_t(8 + len_bytes)) throw Error(cat(f, ": .npy file ends inside its header length"));
  const size_t header_len = little_endian(bytes, 8, len_bytes), header_at = size_t(8 + len_bytes);
  if (header_len > bytes.size() - header_at)
    throw Error(cat(f, ": .npy header of ", header_len, " bytes runs past the end of the file (", bytes.size(), " bytes)"));
  const NpyHeader h = HeaderReader(bytes.substr(header_at, header_len), f).read();
  if (h.fortran_order) throw Error(cat(f, ": Fortran order is not supported; expected a C-order array"));
  DType stored;
  if (h.descr == "<f4") stored = DType::F32;
  else if (h.descr == "<f8") stored = DType::F64;
  else if (h.descr == "<i4") stored = DType::I32;
  else if (h.descr == "<i8") stored = DType::I64;
  else throw Error(cat(f, ": dtype '", h.descr, "' not supported; expected <f4, <f8, <i4 or <i8"));
  const size_t data_at = header_at + header_len, data_bytes = bytes.size() - data_at;
  const auto need = checked_nbytes(h.shape, stored);
  if (!need || uint64_t(*need) != data_bytes)
    throw Error(cat(f, ": shape ", shape_str(h.shape), " of ", h.descr, " needs ",
                    need ? cat(*need, " bytes") : std::string("more bytes than int64 holds"), " but the file holds ",
                    data_bytes, " after its header"));
  return {stored, h.shape, data_at};
}

}  // namespace

Tensor load_npy(const std::filesystem::path& path) {
  const std::string bytes = read_file_text(path);
  const NpyLayout l = parse_npy(bytes, path.string());
  Tensor t = Tensor::empty(l.dtype, l.shape);
  if (t.nbytes() > 0) std::memcpy(t.raw_mut(), bytes.data() + l.data_at, t.nbytes());
  if (l.dtype == DType::F64) return to_f32(t);
  return t;
}

Tensor map_npy_f32(const std::filesystem::path& path) {
  size_t size = 0;
  std::shared_ptr<const void> map = map_readonly(path, size, "a .npy file");
  const NpyLayout l = parse_npy(std::string_view(static_cast<const char*>(map.get()), size), path.string());
  if (l.dtype != DType::F32) throw Error(cat(path.string(), ": a float32 (<f4) array is expected"));
  return Tensor::borrow(DType::F32, l.shape, static_cast<const char*>(map.get()) + l.data_at, map);
}

}  // namespace lineage::io
