// Errors: bad input from outside throws lineage::Error; internal contracts use LINEAGE_CHECK.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lineage {

// Bad input from outside (files, configs, command-line values). The message names the file, the
// field, what was found and what was expected.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& msg);

template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Builds a message from any streamable pieces: throw Error(cat("file ", path, ": ..."));
template <class... Args>
std::string cat(const Args&... args) {
  return detail::concat(args...);
}

}  // namespace lineage

// Always-on internal contract check; prints file:line, the expression and the values given.
#define LINEAGE_CHECK(cond, ...)                                                            \
  do {                                                                                      \
    if (!(cond)) ::lineage::detail::check_failed(__FILE__, __LINE__, #cond,                 \
                                                 ::lineage::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
