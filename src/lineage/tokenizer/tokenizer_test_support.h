// Shared by the tokenizer tests (tokenizer_test.cpp: GPT-2 against js-tiktoken; tiktoken_test.cpp:
// Kimi's tiktoken.model against npm tiktoken): the reference segments in $LINEAGE_TESTDATA/tokenizer,
// failure messages that show ids and text, the checks every tokenizer passes over the corpus (and
// its encode speed), and scratch directories and error checks for malformed-file tests.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/tokenizer/bpe_model.h"
#include "lineage/tokenizer/tokenizer.h"

namespace lineage::tokenizer::test {

struct Segment {
  std::string file;
  int index = 0;
  std::string text;
  std::vector<int32_t> ids;                          // allow_special = true
  std::optional<std::vector<int32_t>> ids_ordinary;  // allow_special = false, where it differs
};

// What every reference file holds; a test's own reference type derives from it and adds the file's
// other top-level fields.
struct Reference {
  std::string error;  // non-empty when the reference data could not be read
  std::filesystem::path dir;  // $LINEAGE_TESTDATA/tokenizer
  std::vector<Segment> segments;
};

// Reads $LINEAGE_TESTDATA/tokenizer/`file_name` into an R (derived from Reference): first
// `read_fields(json, R&)` for the file's own top-level fields, then its "segments". Missing data, a
// field that does not parse, or fewer than 100 segments is R::error, a failure rather than a skip.
template <class R, class ReadFields>
R load_reference(const std::string& file_name, ReadFields read_fields) {
  R r;
  const char* root = std::getenv("LINEAGE_TESTDATA");
  if (root == nullptr || *root == '\0') {
    r.error = "LINEAGE_TESTDATA is not set. HINT: run the CTest fixture reference_tokenizer, or "
              "`node tests/tokenizer/reference_tokenize.mjs tests/tokenizer $DIR/tokenizer` and set LINEAGE_TESTDATA=$DIR";
    return r;
  }
  r.dir = std::filesystem::path(root) / "tokenizer";
  const std::filesystem::path path = r.dir / file_name;
  std::ifstream in(path);
  if (!in) {
    r.error = cat(path.string(), " is missing. HINT: run tests/tokenizer/reference_tokenize.mjs");
    return r;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    read_fields(j, r);
    for (const nlohmann::json& s : j.at("segments")) {
      Segment seg{s.at("file").get<std::string>(), s.at("index").get<int>(), s.at("text").get<std::string>(),
                  s.at("ids").get<std::vector<int32_t>>(), std::nullopt};
      if (s.contains("ids_ordinary")) seg.ids_ordinary = s.at("ids_ordinary").get<std::vector<int32_t>>();
      r.segments.push_back(std::move(seg));
    }
  } catch (const std::exception& e) {
    r.error = cat(path.string(), ": ", e.what());
  }
  if (r.error.empty() && r.segments.size() < 100) r.error = cat("only ", r.segments.size(), " segments in the reference");
  return r;
}

// Binds `ref` to the reference that `load` returns, and ends the test when it could not be read.
#define LINEAGE_REQUIRE_REFERENCE(ref, load) \
  const auto& ref = load;                    \
  ASSERT_TRUE(ref.error.empty()) << ref.error

// The ids around `at`, with ids[at] in brackets.
inline std::string ids_around(const std::vector<int32_t>& ids, size_t at) {
  std::ostringstream os;
  const size_t lo = at > 5 ? at - 5 : 0;
  for (size_t i = lo; i < std::min(ids.size(), at + 6); ++i) os << (i == at ? "[" : "") << ids[i] << (i == at ? "] " : " ");
  return os.str();
}

// Escapes control characters and bytes that are not UTF-8 so a failure message shows the exact text.
inline std::string visible(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto b = uint8_t(text[i]);
    const int length = utf8_sequence_length(text, i);
    if (b == '\n') {
      out += "\\n";
    } else if (length == 0 || b < 0x20 || b == 0x7F) {
      out += cat("\\x", "0123456789abcdef"[b >> 4], "0123456789abcdef"[b & 15]);
    } else {
      out.append(text.substr(i, size_t(length)));
    }
    i += size_t(std::max(length, 1));
  }
  return out;
}

// Empty when equal; otherwise where and how `got` departs from `want`, with the text around it.
inline std::string compare_ids(const Tokenizer& tok, const Segment& seg, const std::vector<int32_t>& want,
                               const std::vector<int32_t>& got) {
  if (want == got) return {};
  size_t at = 0;
  while (at < want.size() && at < got.size() && want[at] == got[at]) ++at;
  const std::string prefix = tok.decode(std::vector<int32_t>(want.begin(), want.begin() + std::ptrdiff_t(at)));
  const size_t from = prefix.size() > 20 ? prefix.size() - 20 : 0;
  const std::string_view text(seg.text);
  return cat(seg.file, " segment ", seg.index, ": first difference at token ", at, " of ", want.size(), " (got ",
             got.size(), " tokens), byte ", prefix.size(), "\n  text there: \"", visible(text.substr(from, prefix.size() - from)),
             " >>> ", visible(text.substr(std::min(prefix.size(), text.size()), 40)), "\"\n  expected ids: ",
             ids_around(want, at), "\n  got ids:      ", ids_around(got, at));
}

inline bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += size_t(n);
  }
  return true;
}

// Every segment's text survives decode(encode(text)), with allow_special true and with false, and
// so do `bytes` (text that is not UTF-8, which a tokenizer with a token for every byte carries too).
inline void expect_decode_inverts_encode(const Tokenizer& tok, const std::vector<Segment>& segments,
                                         const std::string& bytes) {
  size_t failed = 0;
  for (const Segment& seg : segments) {
    for (bool allow_special : {true, false}) {
      if (tok.decode(tok.encode(seg.text, allow_special)) != seg.text && ++failed <= 3) {
        ADD_FAILURE() << seg.file << " segment " << seg.index << " (allow_special " << allow_special
                      << ") does not survive encode + decode";
      }
    }
  }
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(tok.decode(tok.encode(bytes)), bytes);
}

// StreamDecoder over each segment's ids emits only valid UTF-8 and joins to the text; across the
// corpus it holds bytes back (a token's piece shorter than the token) more than 100 times.
inline void expect_stream_decode_emits_whole_characters(const Tokenizer& tok, const std::vector<Segment>& segments) {
  size_t held_back = 0, failed = 0;
  for (const Segment& seg : segments) {
    StreamDecoder stream(tok);
    std::string joined;
    bool valid = true;
    for (int32_t id : seg.ids) {
      const std::string piece = stream.push(id);
      valid = valid && is_valid_utf8(piece);
      held_back += piece.size() < tok.token_bytes(id).size();
      joined += piece;
    }
    const std::string rest = stream.flush();
    valid = valid && is_valid_utf8(rest);
    joined += rest;
    if ((!valid || joined != seg.text) && ++failed <= 3) {
      ADD_FAILURE() << seg.file << " segment " << seg.index << ": streamed text "
                    << (valid ? "differs from the original" : "holds invalid UTF-8");
    }
  }
  EXPECT_EQ(failed, 0u);
  EXPECT_GT(held_back, 100u) << "the corpus should split characters across tokens";
}

// Encodes the corpus (every segment's text) with `tok`, whose cache is empty, then again warm;
// prints both speeds after `label` and expects as many ids both times and, in an optimised build,
// more than 1 MB/s with the empty cache.
inline void expect_encode_speed(const Tokenizer& tok, const std::vector<Segment>& segments, const std::string& label) {
  std::string corpus;
  for (const Segment& seg : segments) corpus += seg.text;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t cold = tok.encode(corpus).size();
  const auto t1 = std::chrono::steady_clock::now();
  const size_t warm = tok.encode(corpus).size();
  const auto t2 = std::chrono::steady_clock::now();
  const double mb = double(corpus.size()) / 1e6;
  const double cold_mbs = mb / std::chrono::duration<double>(t1 - t0).count();
  const double warm_mbs = mb / std::chrono::duration<double>(t2 - t1).count();
  std::cout << "[ tokenizer ] " << label << "encode " << corpus.size() << " bytes -> " << cold << " tokens: " << cold_mbs
            << " MB/s with an empty cache, " << warm_mbs << " MB/s warm\n";
  EXPECT_EQ(cold, warm);
#ifdef NDEBUG
  EXPECT_GT(cold_mbs, 1.0) << "encode is far slower than expected";
#endif
}

// A scratch directory for one test, removed with it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / cat("lineage_tokenizer_test_", ::getpid(), "_", counter()++);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::filesystem::path write(const std::string& name, std::string_view text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return path / name;
  }
};

// Runs `load`, expecting an Error whose message holds every one of `needles`.
template <class F>
void expect_error(F load, std::initializer_list<std::string> needles) {
  try {
    load();
    ADD_FAILURE() << "no Error thrown; expected one mentioning " << *needles.begin();
  } catch (const Error& e) {
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what() << "\nlacks: " << needle;
    }
  }
}

}  // namespace lineage::tokenizer::test
