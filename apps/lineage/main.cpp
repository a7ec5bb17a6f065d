// lineage: run, inspect and measure decoder-only language models from GPT-2 to Kimi.
#include <cstdio>
#include <string>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/io/mapping_guard.h"
#include "ranks.h"

int main(int argc, char** argv) {
  lineage::io::install_mapping_fault_handler();
  CLI::App app{"lineage: decoder-only language models from GPT-2 to Kimi, on the CPU"};
  app.require_subcommand(1);
  app.fallthrough(false);
  lineage::app::add_generate(app);
  lineage::app::add_logits(app);
  lineage::app::add_perplexity(app);
  lineage::app::add_gguf(app);
  lineage::app::add_quantize(app);
  lineage::app::add_tokenize(app);
  lineage::app::add_info(app);
  lineage::app::add_tour(app);
  lineage::app::add_bench(app);
  lineage::app::add_serve(app);
  lineage::app::add_bench_serve(app);
  lineage::app::add_chat(app);
  lineage::app::add_train(app);
  lineage::app::add_bench_train(app);
  lineage::app::add_study(app);
  lineage::app::add_trace(app);
  try {
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands([&](CLI::App* s) { return s->check_name(argv[1]); }).empty()) {
      std::string names;
      for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) names += (names.empty() ? "" : ", ") + sub->get_name();
      throw lineage::Error(std::string("unknown command \"") + argv[1] + "\"; expected one of: " + names);
    }
    lineage::app::start_ranks(argc > 1 ? argv[1] : "");
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "lineage: error: %s\nRun with --help for usage.\n", e.what());
    return 2;
  } catch (const lineage::Error& e) {
    return lineage::app::failed(e.what());
  } catch (const std::exception& e) {  // e.g. a filesystem error on a path the user gave
    return lineage::app::failed(e.what());
  }
  lineage::app::end_ranks();
  return 0;
}
