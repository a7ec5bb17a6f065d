// The files `lineage train` reads back: a .bin corpus (train::decode_bin, the vocabulary from the
// first two bytes) and a checkpoint's loss.csv (train::parse_loss_csv), chosen by the input's first
// byte. Every accepted id must lie in the vocabulary, and an accepted curve must keep its rows.
#include <string>

#include "fuzz_support.h"
#include "lineage/core/error.h"
#include "lineage/train/trainer.h"

using namespace lineage;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 3, size - 3);
  try {
    if (data[0] & 1) {
      // Vocabularies around the uint16 / uint32 switch and small ones.
      const int64_t vocab = 1 + ((int64_t(data[1]) << 8 | data[2]) << (data[0] & 2 ? 2 : 0));
      for (const int32_t id : train::decode_bin(body, vocab, "corpus.bin"))
        if (id < 0 || id >= vocab) fuzz::violated(cat("accepted id ", id, " outside a vocabulary of ", vocab));
    } else {
      const auto rows = train::parse_loss_csv(body, "loss.csv");
      size_t lines = 0;
      for (const char c : body) lines += c == '\n';
      if (rows.size() > lines + 1) fuzz::violated(cat(rows.size(), " rows from ", lines + 1, " lines"));
    }
  } catch (const Error& e) {
    fuzz::rejected(e);
  }
  return 0;
}
