// One .safetensors file through io::SafetensorsFile: the 8-byte header length, the JSON header
// (dtype, shape, data_offsets of every tensor) and the data section. A file the parser accepts must
// keep every tensor inside the data section, non-overlapping, with exactly shape × dtype bytes, and
// every tensor view must be readable end to end.
#include <cstring>

#include "fuzz_support.h"
#include "lineage/core/error.h"
#include "lineage/io/safetensors.h"

using namespace lineage;

namespace {

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& r) { return __builtin_mul_overflow(a, b, &r); }

void check_accepted(const io::SafetensorsFile& file, const uint8_t* data, size_t size) {
  if (size < 8) fuzz::violated("accepted a file shorter than the 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, data, 8);
  if (header_len > size - 8) fuzz::violated("accepted a header length past the end of the file");
  const uint64_t data_size = size - 8 - header_len;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, e] : file.entries()) {
    if (e.begin > e.end || e.end > data_size)
      fuzz::violated(cat("tensor \"", name, "\": [", e.begin, ", ", e.end, ") outside a data section of ", data_size));
    uint64_t bytes = dtype_size(e.dtype);
    for (int64_t d : e.shape) {
      if (d < 0 || mul_overflows(bytes, uint64_t(d), bytes))
        fuzz::violated(cat("tensor \"", name, "\": shape ", shape_str(e.shape), " overflows or is negative"));
    }
    if (bytes != e.end - e.begin)
      fuzz::violated(cat("tensor \"", name, "\": ", e.end - e.begin, " bytes for shape ", shape_str(e.shape)));
    spans.emplace_back(e.begin, e.end);
    const Tensor t = file.tensor(name);
    if (t.shape() != e.shape || t.dtype() != e.dtype || t.nbytes() != bytes)
      fuzz::violated(cat("tensor \"", name, "\": the view differs from its entry"));
    const auto* p = static_cast<const unsigned char*>(t.raw());
    const auto* first = data + 8 + header_len;
    if (bytes > 0 && std::memcmp(p, first + e.begin, bytes) != 0)
      fuzz::violated(cat("tensor \"", name, "\": the view does not hold the file's bytes"));
  }
  fuzz::check_disjoint(spans);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch_dir() / "model.safetensors";
  fuzz::write_file(path, data, size);
  try {
    const io::SafetensorsFile file(path);
    check_accepted(file, data, size);
  } catch (const Error& e) {
    fuzz::rejected(e);  // a rejection with a message: what hostile input should get
  }
  return 0;
}
