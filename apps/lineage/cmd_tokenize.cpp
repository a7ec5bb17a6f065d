// lineage tokenize / detokenize.
#include <cstdio>

#include "common.h"

namespace lineage::app {

void add_tokenize(CLI::App& app) {
  struct Opts {
    std::string dir, text, tokens;
    bool no_special = false;
  };
  static Opts o;
  auto* enc = app.add_subcommand("tokenize", "print the token ids of a text, separated by spaces");
  enc->add_option("--model", o.dir, "model directory with tokenizer files")->required();
  enc->add_option("--text", o.text, "text to tokenize")->required();
  enc->add_flag("--no-special", o.no_special, "treat special tokens such as <|endoftext|> as plain text");
  add_threads_option(*enc);
  enc->callback([] {
    const io::Tokenizer tok = io::Tokenizer::load(o.dir);
    const auto ids = tok.encode(o.text, !o.no_special);
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
    std::printf("\n");
  });
  auto* dec = app.add_subcommand("detokenize", "print the text of token ids");
  dec->add_option("--model", o.dir, "model directory with tokenizer files")->required();
  dec->add_option("--tokens", o.tokens, "token ids separated by spaces")->required();
  add_threads_option(*dec);
  dec->callback([] {
    const io::Tokenizer tok = io::Tokenizer::load(o.dir);
    const std::string text = tok.decode(parse_ids(o.tokens, "--tokens"));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
  });
}

}  // namespace lineage::app
