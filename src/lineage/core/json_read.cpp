#include "lineage/core/json_read.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "lineage/core/error.h"

namespace lineage {

namespace fs = std::filesystem;

namespace {
struct TooDeep {};
}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& where) {
  const auto limit = [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth) throw TooDeep{};
    return true;
  };
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
    throw Error(cat(where, ": is empty; expected a JSON document"));
  try {
    return nlohmann::json::parse(text.begin(), text.end(), limit);
  } catch (const TooDeep&) {
    throw Error(cat(where, ": JSON nested more than ", kMaxJsonDepth, " levels deep; expected a shallower document"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat(where, ": not valid JSON: ", e.what()));
  }
}

std::string read_file_text(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error(cat(path.string(), ": is a directory; expected a file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(cat(path.string(), ": cannot open the file: ", std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(cat(path.string(), ": read failed"));
  return ss.str();
}

nlohmann::json read_json_file(const fs::path& path) { return parse_json(read_file_text(path), path.string()); }

}  // namespace lineage
