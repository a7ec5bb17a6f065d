// lineage quantize: a float Hugging Face checkpoint written as compressed-tensors int4 / int8 / FP8 /
// MXFP4 / NVFP4 (io/quantize.h), with a progress bar of bytes and the time left.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/io/quantize.h"

namespace lineage::app {

void add_quantize(CLI::App& app) {
  struct Opts {
    std::string in, out, scheme;
    std::optional<int64_t> group;
    std::vector<std::string> ignore;
    double shard_gb = 4.0;
  };
  static Opts o;
  auto* cmd = app.add_subcommand(
      "quantize", "write a float checkpoint as a compressed-tensors one (llm-compressor's data-free RTN presets)");
  cmd->add_option("in", o.in, "the float model directory (config.json + safetensors)")->required();
  cmd->add_option("out", o.out, "the directory to write (new, or empty)")->required();
  cmd->add_option("--scheme", o.scheme,
                  "W4A16 (int4, group 128, symmetric), W4A16_ASYM (zero points), W8A16 (int8, group 128), FP8_BLOCK "
                  "(E4M3, 128x128 blocks), MXFP4 or NVFP4 (weight-only: MXFP4A16, NVFP4A16)")
      ->required();
  cmd->add_option("--group", o.group, "int schemes: columns per scale (32, 64, 128, ...; 0 for one per output row)");
  cmd->add_option("--ignore", o.ignore,
                  "a module to leave unquantized: its name, or re:PATTERN matched from the start of the name "
                  "(repeatable; replaces the defaults: lm_head, routers, gates and Gated DeltaNet / KDA gate projections)");
  cmd->add_option("--shard-size", o.shard_gb, "GB per safetensors shard")->check(CLI::Range(0.001, 1e6));
  cmd->callback([] {
    io::QuantizeOptions q;
    q.scheme = io::parse_rtn_scheme(o.scheme);
    if (o.group && q.scheme != io::RtnScheme::W4A16 && q.scheme != io::RtnScheme::W4A16_ASYM && q.scheme != io::RtnScheme::W8A16)
      throw Error(cat("--group: ", o.scheme, " fixes its groups (FP8 128x128 blocks, MXFP4 32, NVFP4 16)"));
    if (o.group && *o.group != 0 && (*o.group < 16 || *o.group % 16))
      throw Error(cat("--group: ", *o.group, " is not 0 or a multiple of 16 (lineage's kernels take groups of whole 16s)"));
    q.group = o.group;
    q.ignore = o.ignore;
    q.shard_bytes = size_t(o.shard_gb * 1e9);
    const bool tty = isatty(2);
    const auto start = std::chrono::steady_clock::now();
    int last_tenth = -1;
    q.progress = [&](size_t done, size_t total) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double f = total ? double(done) / double(total) : 1.0;
      const double eta = f > 0 ? s * (1 - f) / f : 0;
      if (tty) {
        const int bar = int(f * 30);
        std::fprintf(stderr, "\r[%s%s] %s / %s  %.0f s left   ", std::string(size_t(bar), '#').c_str(),
                     std::string(size_t(30 - bar), '.').c_str(), format_bytes(double(done)).c_str(),
                     format_bytes(double(total)).c_str(), eta);
      } else if (int(f * 10) != last_tenth) {
        last_tenth = int(f * 10);
        std::fprintf(stderr, "quantize: %s / %s read, %.0f s left\n", format_bytes(double(done)).c_str(),
                     format_bytes(double(total)).c_str(), eta);
      }
    };
    const io::QuantizeReport r = io::quantize_checkpoint(o.in, o.out, q);
    if (tty) std::fprintf(stderr, "\n");
    for (const std::string& u : r.unfit) std::printf("left unquantized: %s\n", u.c_str());
    std::printf("%s: %lld matrices quantized as %s, %lld left as they were; %s -> %s\n", o.out.c_str(),
                (long long)r.quantized, o.scheme.c_str(), (long long)r.kept, format_bytes(double(r.bytes_in)).c_str(),
                format_bytes(double(r.bytes_out)).c_str());
  });
}

}  // namespace lineage::app
