#include "lineage/io/npy.h"

#include <cstring>
#include <fstream>

#include "lineage/core/error.h"

namespace lineage::io {

void save_npy(const std::filesystem::path& path, const float* data, const Shape& shape) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error(cat(path.string(), ": cannot open for writing"));
  const uint16_t len = uint16_t(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(data), std::streamsize(shape_numel(shape) * 4));
  if (!out) throw Error(cat(path.string(), ": write failed"));
}

Tensor load_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(cat(path.string(), ": cannot open"));
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw Error(cat(path.string(), ": not a .npy file"));
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t h;
    in.read(reinterpret_cast<char*>(&h), 2);
    hlen = h;
  } else {
    in.read(reinterpret_cast<char*>(&hlen), 4);
  }
  std::string header(hlen, '\0');
  in.read(header.data(), hlen);
  const auto field = [&](const std::string& key) {
    const size_t p = header.find("'" + key + "'");
    if (p == std::string::npos) throw Error(cat(path.string(), ": header lacks '", key, "'"));
    return header.substr(header.find(':', p) + 1);
  };
  if (field("fortran_order").find("True") < field("fortran_order").find(',')) throw Error(cat(path.string(), ": Fortran order is not supported"));
  const std::string descr_s = field("descr");
  const size_t q0 = descr_s.find('\''), q1 = descr_s.find('\'', q0 + 1);
  const std::string descr = descr_s.substr(q0 + 1, q1 - q0 - 1);
  const std::string shape_s = field("shape");
  Shape shape;
  for (size_t i = shape_s.find('(') + 1; i < shape_s.find(')');) {
    const size_t j = shape_s.find_first_of(",)", i);
    const std::string num = shape_s.substr(i, j - i);
    if (num.find_first_not_of(' ') != std::string::npos) shape.push_back(std::stoll(num));
    i = j + 1;
  }
  const auto read = [&](Tensor t) {
    in.read(static_cast<char*>(t.raw_mut()), std::streamsize(t.nbytes()));
    if (!in) throw Error(cat(path.string(), ": data shorter than shape ", shape_str(shape)));
    return t;
  };
  if (descr == "<f4") return read(Tensor::empty(DType::F32, shape));
  if (descr == "<i4") return read(Tensor::empty(DType::I32, shape));
  if (descr == "<i8") return read(Tensor::empty(DType::I64, shape));
  if (descr == "<f8") {
    Tensor d = read(Tensor::empty(DType::F64, shape));
    return to_f32(d);
  }
  throw Error(cat(path.string(), ": dtype '", descr, "' not supported; expected <f4, <f8, <i4 or <i8"));
}

}  // namespace lineage::io
