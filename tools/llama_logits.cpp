// llama.cpp's logits of a token sequence on a GGUF file, as a .npy of float32 [T, vocab]: the
// reference side of lineage's GGUF comparisons (tests/gguf_llama_test.cpp). An f32 KV cache and flash
// attention off, so that llama.cpp's f32 CPU path is f32 throughout; every position's logits kept.
//
//   llama-logits MODEL.gguf OUT.npy TOKEN [TOKEN ...] [--chunk N] [--threads T]
//
// --chunk N feeds the tokens N at a time (1: token by token); default all at once.
// Not part of lineage's build: scripts/install-llama-cpp.sh compiles it against the llama.cpp
// reference in ~/.cache/lineage (its public llama.h, linked with libllama.a and ggml's libraries).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

namespace {

int usage() {
  std::fprintf(stderr, "usage: llama-logits MODEL.gguf OUT.npy TOKEN [TOKEN ...] [--chunk N] [--threads T]\n");
  return 2;
}

void quiet(enum ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

// NumPy's .npy version 1.0: float32, C order, shape (rows, cols).
bool write_npy(const char* path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  FILE* f = std::fopen(path, "wb");
  if (!f) return false;
  const uint16_t len = uint16_t(header.size());
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  bool ok = std::fwrite(magic, 1, 8, f) == 8 && std::fwrite(&len, 2, 1, f) == 1 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(data.data(), sizeof(float), data.size(), f) == data.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return usage();
  const char* model_path = argv[1];
  const char* out_path = argv[2];
  std::vector<llama_token> tokens;
  int chunk = 0, threads = 2;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--chunk" && i + 1 < argc) chunk = std::atoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!a.empty() && (a[0] >= '0' && a[0] <= '9')) tokens.push_back(llama_token(std::atol(a.c_str())));
    else return usage();
  }
  if (tokens.empty() || threads < 1 || chunk < 0) return usage();
  const int n = int(tokens.size());
  if (chunk == 0) chunk = n;

  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.progress_callback = [](float, void*) { return true; };  // no progress dots
  llama_model* model = llama_model_load_from_file(model_path, mp);
  if (!model) return std::fprintf(stderr, "llama-logits: cannot load %s\n", model_path), 1;
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (llama_token t : tokens)
    if (t < 0 || t >= vocab) return std::fprintf(stderr, "llama-logits: token %d outside [0, %d)\n", t, vocab), 1;

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(n < 32 ? 32 : n);
  cp.n_batch = cp.n_ubatch = uint32_t(n);
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return std::fprintf(stderr, "llama-logits: cannot create a context\n"), 1;

  std::vector<float> all(size_t(n) * size_t(vocab));
  llama_batch batch = llama_batch_init(chunk, 0, 1);
  for (int at = 0; at < n; at += chunk) {
    const int m = n - at < chunk ? n - at : chunk;
    batch.n_tokens = m;
    for (int i = 0; i < m; ++i) {
      batch.token[i] = tokens[size_t(at + i)];
      batch.pos[i] = at + i;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = 1;
    }
    if (llama_decode(ctx, batch) != 0) return std::fprintf(stderr, "llama-logits: llama_decode failed at %d\n", at), 1;
    for (int i = 0; i < m; ++i)
      std::memcpy(&all[size_t(at + i) * size_t(vocab)], llama_get_logits_ith(ctx, i), size_t(vocab) * sizeof(float));
  }
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  if (!write_npy(out_path, all, n, vocab)) return std::fprintf(stderr, "llama-logits: cannot write %s\n", out_path), 1;
  return 0;
}
