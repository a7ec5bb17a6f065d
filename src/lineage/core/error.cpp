#include "lineage/core/error.h"

#include <cstdio>
#include <cstdlib>

namespace lineage::detail {

void check_failed(const char* file, int line, const char* expr, const std::string& msg) {
  std::fprintf(stderr, "lineage: internal check failed at %s:%d: %s %s\n", file, line, expr, msg.c_str());
  std::abort();
}

}  // namespace lineage::detail
