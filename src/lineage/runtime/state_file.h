// State files: one sequence's whole state (position, KV rows / MLA latents, recurrent S, conv tails)
// with the token ids it was fed, the logits after the last one and the sampler's random stream, in a
// versioned binary file that names the model it belongs to (docs/state-files.md). Loading it into a
// session continues bit for bit as if the process had never stopped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lineage/core/rng.h"
#include "lineage/model/model.h"
#include "lineage/model/state_pool.h"

namespace lineage::runtime {

inline constexpr uint32_t kStateFileVersion = 1;

struct SavedState {
  model::SequenceState state;
  std::vector<int32_t> tokens;     // every token fed, oldest first: empty, or state.position of them
  std::vector<float> logits;       // [V] after the last token, or empty
  std::optional<Rng::Snapshot> rng;  // the sampler's stream after the last draw, or none
  // The application's own data, kept as given in the header ("meta"): `lineage chat` keeps the
  // conversation's messages there. Null when there is none.
  nlohmann::json meta;
};

// Writes the file through `sink` in pieces (the state is not copied whole first). `s.state` must be
// a state of m.
void write_state(const model::Model& m, const SavedState& s, const std::function<void(const void*, size_t)>& sink);
std::string encode_state(const model::Model& m, const SavedState& s);
// Reads a whole file's bytes. Throws Error naming `where` for anything but a state of this model in
// this version: a bad magic, a version mismatch, a truncated or corrupted file (the checksum), a
// malformed header, another model (identity, layer kinds, array shapes).
SavedState decode_state(const model::Model& m, std::string_view bytes, const std::string& where);

// To a file: written to FILE.tmp, then renamed over FILE, so a crash never leaves half a state.
void save_state(const std::filesystem::path& path, const model::Model& m, const SavedState& s);
SavedState load_state(const std::filesystem::path& path, const model::Model& m);

}  // namespace lineage::runtime
