// One .npy file through io::load_npy (magic, version, header length, the header dict's descr,
// fortran_order and shape, then the data). An accepted array must fit in the file it came from, and
// a float32 one must survive save_npy → load_npy bit for bit.
#include <cstring>

#include "fuzz_support.h"
#include "lineage/core/error.h"
#include "lineage/io/npy.h"

using namespace lineage;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch_dir() / "array.npy";
  fuzz::write_file(path, data, size);
  Tensor t;
  try {
    t = io::load_npy(path);
  } catch (const Error& e) {
    fuzz::rejected(e);
    return 0;
  }
  if (!t.defined()) fuzz::violated("load_npy returned an undefined tensor");
  for (int64_t d : t.shape()) {
    if (d < 0) fuzz::violated(cat("accepted a negative dimension: ", shape_str(t.shape())));
  }
  // Every element came from the file: at least 4 bytes each (f8 is narrowed to f4).
  if (t.numel() > int64_t(size / 4)) fuzz::violated(cat("shape ", shape_str(t.shape()), " from a file of ", size, " bytes"));
  if (t.dtype() != DType::F32) return 0;
  const auto copy = fuzz::scratch_dir() / "copy.npy";
  try {
    io::save_npy(copy, t.data<float>(), t.shape());
    const Tensor back = io::load_npy(copy);
    if (back.shape() != t.shape() || back.dtype() != DType::F32 ||
        (t.nbytes() > 0 && std::memcmp(back.raw(), t.raw(), t.nbytes()) != 0))
      fuzz::violated(cat("save_npy → load_npy changed an array of shape ", shape_str(t.shape())));
  } catch (const Error& e) {
    fuzz::violated(cat("load_npy rejects what save_npy wrote: ", e.what()));
  }
  return 0;
}
