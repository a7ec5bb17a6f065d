// The tokenizer files of a model directory through tokenizer::Tokenizer::load. The first byte picks the
// layout: bit 0 clear: tokenizer.json; set: vocab.json + merges.txt; bit 1: a tokenizer_config.json
// follows. The rest is those files in that order, then a text to encode, separated by "\n@@@@\n".
// A loaded tokenizer must encode the text (or reject it with an Error) into ids that decode and
// stream-decode into valid UTF-8; GPT-2's byte-level vocab.json + merges.txt must give it back exactly.
// Ids made from the text's bytes (out of range or holes among them) must decode or be an Error.
#include <optional>
#include <string>

#include "fuzz_support.h"
#include "lineage/core/error.h"
#include "lineage/tokenizer/tokenizer.h"

using namespace lineage;
namespace fs = std::filesystem;

namespace {

const char kDefaultText[] =
    "Hello world! It's 2024, 3.14 and  tabs\there.\n<|endoftext|></s><s> caf\xC3\xA9 \xE2\x96\x81x "
    "\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 \xFF\xC3(";

void put(const fs::path& path, const std::vector<std::string_view>& sections, size_t& next) {
  fuzz::write_file(path, next < sections.size() ? sections[next] : std::string_view());
  ++next;
}

void check_loaded(const tokenizer::Tokenizer& tok, std::string_view text, bool exact_round_trip) {
  const int32_t vocab = tok.vocab_size();
  for (bool allow_special : {true, false}) {
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(text, allow_special);
    } catch (const Error& e) {  // text the vocabulary cannot spell (no byte fallback, no unk)
      fuzz::rejected(e);
      continue;
    }
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab) fuzz::violated(cat("encode gave id ", id, " outside the vocabulary of ", vocab));
    }
    // Not caught: ids that encode produced must decode (an Error here is a bug, not a rejection).
    const std::string decoded = tok.decode(ids);
    if (exact_round_trip && decoded != text) fuzz::violated("byte-level BPE did not give the text back");
    tokenizer::StreamDecoder stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    if (!fuzz::valid_utf8(streamed)) fuzz::violated("StreamDecoder returned invalid UTF-8");
  }
  // Ids from outside (`lineage detokenize --tokens`): out of range, holes, anything; an Error at most.
  try {
    (void)tok.decode(fuzz::ids_from_bytes(text, vocab));
  } catch (const Error& e) {
    fuzz::rejected(e);
  }
  for (const auto id : {tok.eos_id(), tok.bos_id()}) {
    if (id && (*id < 0 || *id >= vocab)) fuzz::violated(cat("eos/bos id ", *id, " outside the vocabulary"));
    if (id) (void)tok.token_bytes(*id);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool vocab_merges = data[0] & 1, with_config = data[0] & 2;
  const std::vector<std::string_view> sections =
      fuzz::split_sections(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  const fs::path dir = fuzz::scratch_dir();
  for (const char* name : {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"})
    fs::remove(dir / name);
  size_t next = 0;
  if (vocab_merges) {
    put(dir / "vocab.json", sections, next);
    put(dir / "merges.txt", sections, next);
  } else {
    put(dir / "tokenizer.json", sections, next);
  }
  if (with_config) put(dir / "tokenizer_config.json", sections, next);
  std::string_view text = next < sections.size() ? sections[next] : std::string_view(kDefaultText);
  if (text.size() > 4096) text = text.substr(0, 4096);  // the loaders are the target, not BPE speed
  const std::optional<tokenizer::Tokenizer> tok = fuzz::load_or_reject([&] { return tokenizer::Tokenizer::load(dir); });
  if (tok) check_loaded(*tok, text, vocab_merges);
  return 0;
}
