// lineage tokenize / detokenize.
#include <cstdio>
#include <fstream>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/core/json_read.h"

namespace lineage::app {

void add_tokenize(CLI::App& app) {
  struct Opts {
    std::string dir, text, file, out, tokens;
    bool no_special = false;
  };
  static Opts o;
  auto* enc = app.add_subcommand("tokenize", "print the token ids of a text, separated by spaces");
  enc->add_option("--model", o.dir, "model directory with tokenizer files, or a GGUF file")->required();
  auto* text = enc->add_option("--text", o.text, "text to tokenize");
  auto* file = enc->add_option("--file", o.file, "tokenize this file's UTF-8 text instead");
  text->excludes(file);
  enc->add_option("--out", o.out,
                  "write the ids to this .bin file (little-endian uint16 for vocabularies up to 65,536, else uint32: "
                  "what `lineage train --data` reads) instead of printing them");
  enc->add_flag("--no-special", o.no_special, "treat special tokens such as <|endoftext|> as plain text");
  add_threads_option(*enc);
  enc->callback([] {
    if (o.text.empty() && o.file.empty()) throw Error("tokenize: one of --text or --file is required");
    const tokenizer::Tokenizer tok = load_tokenizer(o.dir);
    const auto ids = tok.encode(o.file.empty() ? o.text : read_file_text(o.file), !o.no_special);
    if (o.out.empty()) {
      for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
      std::printf("\n");
      return;
    }
    const size_t width = tok.vocab_size() <= 65536 ? 2 : 4;
    std::string bytes(ids.size() * width, '\0');
    for (size_t i = 0; i < ids.size(); ++i)
      for (size_t b = 0; b < width; ++b) bytes[i * width + b] = char((uint32_t(ids[i]) >> (8 * b)) & 0xff);
    std::ofstream f(o.out, std::ios::binary);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    if (!f) throw Error(cat(o.out, ": cannot be written"));
    std::fprintf(stderr, "%zu tokens -> %s (uint%zu)\n", ids.size(), o.out.c_str(), 8 * width);
  });
  auto* dec = app.add_subcommand("detokenize", "print the text of token ids");
  dec->add_option("--model", o.dir, "model directory with tokenizer files, or a GGUF file")->required();
  dec->add_option("--tokens", o.tokens, "token ids separated by spaces")->required();
  add_threads_option(*dec);
  dec->callback([] {
    const tokenizer::Tokenizer tok = load_tokenizer(o.dir);
    const std::string text = tok.decode(parse_ids(o.tokens, "--tokens"));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
  });
}

}  // namespace lineage::app
