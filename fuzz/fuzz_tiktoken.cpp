// A tiktoken.model model directory (Kimi's layout) through tokenizer::Tokenizer::load. The first byte: bit 0
// set, a tokenizer_config.json follows. The rest is tiktoken.model, then that config, then a text to
// encode, separated by "\n@@@@\n". A loaded tokenizer has 256 special tokens after its ranks; the
// text must encode into ids in the vocabulary that decode to the text exactly (every byte is a
// token, special tokens decode to their names), and stream-decode into valid UTF-8 (the text itself
// where it is valid UTF-8). Ids made from the text's bytes must decode or be an Error.
#include <optional>
#include <string>

#include "fuzz_support.h"
#include "lineage/core/error.h"
#include "lineage/tokenizer/tokenizer.h"

using namespace lineage;
namespace fs = std::filesystem;

namespace {

const char kDefaultText[] =
    "Hello world! DON'T it's 12345 \xE4\xB8\xAD\xE6\x96\x87\xE3\x81\x8B\xE3\x81\xAA [BOS]<|im_end|>[EOS] "
    " \n\n\t caf\xC3\xA9 \xF0\x9F\x98\x80 \xFF\xC3(";

void check_loaded(const tokenizer::Tokenizer& tok, std::string_view text) {
  const int32_t vocab = tok.vocab_size();
  if (vocab < 256 + 256) fuzz::violated(cat("vocab_size ", vocab, " below 256 bytes + 256 special tokens"));
  for (bool allow_special : {true, false}) {
    // Not caught: tiktoken tokenizers spell every text, so an Error here is a bug.
    const std::vector<int32_t> ids = tok.encode(text, allow_special);
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab) fuzz::violated(cat("encode gave id ", id, " outside the vocabulary of ", vocab));
      if (!allow_special && id >= vocab - 256) fuzz::violated(cat("allow_special = false gave special token ", id));
    }
    if (tok.decode(ids) != text) fuzz::violated("decode(encode(text)) is not the text");
    tokenizer::StreamDecoder stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    if (!fuzz::valid_utf8(streamed)) fuzz::violated("StreamDecoder returned invalid UTF-8");
    if (fuzz::valid_utf8(text) && streamed != text) fuzz::violated("StreamDecoder changed valid UTF-8 text");
  }
  // Ids from outside (`lineage detokenize --tokens`): out of range, anything; an Error at most.
  try {
    (void)tok.decode(fuzz::ids_from_bytes(text, vocab));
  } catch (const Error& e) {
    fuzz::rejected(e);
  }
  for (const auto id : {tok.eos_id(), tok.bos_id(), tok.pad_id()}) {
    if (id && (*id < vocab - 256 || *id >= vocab)) fuzz::violated(cat("eos/bos/pad id ", *id, " is not a special token"));
    if (id) (void)tok.token_bytes(*id);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool with_config = data[0] & 1;
  const std::vector<std::string_view> sections =
      fuzz::split_sections(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  const fs::path dir = fuzz::scratch_dir();
  fs::remove(dir / "tokenizer_config.json");
  size_t next = 0;
  fuzz::write_file(dir / "tiktoken.model", sections[next++]);
  if (with_config) fuzz::write_file(dir / "tokenizer_config.json", next < sections.size() ? sections[next++] : "");
  std::string_view text = next < sections.size() ? sections[next] : std::string_view(kDefaultText);
  if (text.size() > 4096) text = text.substr(0, 4096);  // the loader is the target, not BPE speed
  const std::optional<tokenizer::Tokenizer> tok = fuzz::load_or_reject([&] { return tokenizer::Tokenizer::load(dir); });
  if (tok) check_loaded(*tok, text);
  return 0;
}
