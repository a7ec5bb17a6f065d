// model.safetensors.index.json through io::Checkpoint::open, in a directory that holds two valid
// shards, a third shard that repeats a tensor name of the first, and a model.safetensors (which an
// index must override). An accepted checkpoint must answer every name it lists.
#include "fuzz_support.h"
#include "lineage/core/error.h"
#include "lineage/io/safetensors.h"

using namespace lineage;
namespace fs = std::filesystem;

namespace {

Tensor filled(DType dtype, Shape shape) {
  Tensor t = Tensor::zeros(dtype, std::move(shape));
  auto* p = static_cast<unsigned char*>(t.raw_mut());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(i * 37 + 1);
  return t;
}

const fs::path& checkpoint_dir() {
  static const fs::path dir = [] {
    const fs::path d = fuzz::scratch_dir() / "checkpoint";
    fs::create_directories(d);
    // The seeds' index names these files and tensors (fuzz/corpus/fuzz_checkpoint_index/).
    fuzz::write_safetensors(d / "model-00001-of-00002.safetensors",
                            {{"model.embed.weight", filled(DType::F32, {4, 2})},
                             {"model.layers.0.norm.weight", filled(DType::BF16, {2})}});
    fuzz::write_safetensors(d / "model-00002-of-00002.safetensors",
                            {{"model.layers.0.proj.weight", filled(DType::F16, {2, 2})},
                             {"lm_head.weight", filled(DType::F32, {4, 2})}});
    fuzz::write_safetensors(d / "extra.safetensors", {{"model.embed.weight", filled(DType::F32, {1})}});
    fuzz::write_safetensors(d / "model.safetensors", {{"single.weight", filled(DType::F32, {3})}});
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& dir = checkpoint_dir();
  fuzz::write_file(dir / "model.safetensors.index.json", data, size);
  try {
    const io::Checkpoint ckpt = io::Checkpoint::open(dir);
    for (const std::string& name : ckpt.names()) {
      if (!ckpt.has(name)) fuzz::violated(cat("names() lists \"", name, "\" but has() denies it"));
      const io::TensorEntry& e = ckpt.entry(name);
      const Tensor t = ckpt.tensor(name);
      if (t.shape() != e.shape || t.dtype() != e.dtype) fuzz::violated(cat("\"", name, "\": view differs from entry"));
    }
    (void)ckpt.file_bytes();
  } catch (const Error& e) {
    fuzz::rejected(e);
  }
  return 0;
}
