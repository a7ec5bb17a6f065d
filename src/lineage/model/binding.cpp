#include "lineage/model/binding.h"

#include <cstring>
#include <map>
#include <optional>

#include "lineage/core/error.h"

namespace lineage::model {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One stored tensor being joined from parameters: its parts' tensors by slot (a split's group-major
// part order, or an Unstack's expert × part), the rows each slot holds, and how many groups of
// rows (split) or slices (Unstack) it has.
struct Joined {
  std::string name;
  std::vector<Tensor> slots;
  std::vector<int64_t> slot_rows;
  int64_t groups = 1;
  bool stacked = false;  // an Unstack: [slices, Σ rows, …]
};

// Where parameter `name` goes in a split or stacked tensor: the stored name, the slot, and the
// table's description of that tensor's slots, or nothing.
struct Place {
  std::string stored;
  size_t slot = 0;
  std::vector<int64_t> slot_rows;
  int64_t groups = 1;
  bool stacked = false;
};

std::optional<Place> place_of(const BindingTable& b, const std::string& name) {
  for (const BindingTable::Unstack& us : b.unstacks) {
    if (!us.stack_on_save) continue;
    if (const std::optional<UnstackSlot> slot = unstack_slot(us, name); slot && slot->expert < us.slices) {
      Place pl{slot->stored, size_t(slot->expert) * us.parts.size() + slot->part, {}, us.slices, true};
      for (const auto& part : us.parts) pl.slot_rows.push_back(part.second);
      return pl;
    }
  }
  for (const BindingTable::Split& sp : b.splits)
    for (size_t p = 0; p < sp.parts.size(); ++p)
      if (ends_with(name, sp.parts[p].first)) {
        Place pl{name.substr(0, name.size() - sp.parts[p].first.size()) + sp.stored, p, {}, sp.groups, false};
        for (const auto& part : sp.parts) pl.slot_rows.push_back(part.second);
        return pl;
      }
  return std::nullopt;
}

// The stored tensor from its slots: group g (or slice e) holds each part's rows of that group in order.
Tensor join(const Joined& j) {
  const size_t parts = j.slot_rows.size();
  const size_t n_slots = j.stacked ? size_t(j.groups) * parts : parts;
  int64_t per = 0;
  for (const int64_t r : j.slot_rows) per += r;
  const Tensor* first = nullptr;
  for (size_t i = 0; i < n_slots; ++i) {
    LINEAGE_CHECK(i < j.slots.size() && j.slots[i].defined(), j.name, ": part ", i % parts,
                  j.stacked ? cat(" of expert ", i / parts) : std::string(), " has no parameter to join");
    if (!first) first = &j.slots[i];
    LINEAGE_CHECK(j.slots[i].dtype() == first->dtype(), j.name, ": its parts' dtypes differ");
  }
  // Every part's rows per group have the same trailing size: one row's bytes.
  const Shape& s0 = first->shape();
  const int64_t rows0 = j.stacked ? j.slot_rows[0] : j.slot_rows[0] * j.groups;
  const size_t row_bytes = first->nbytes() / size_t(rows0);
  Shape shape = s0;
  if (j.stacked) shape.insert(shape.begin(), j.groups), shape[1] = per;
  else shape[0] = per * j.groups;
  Tensor out = Tensor::empty(first->dtype(), shape);
  char* dst = static_cast<char*>(out.raw_mut());
  for (int64_t g = 0; g < j.groups; ++g)
    for (size_t p = 0; p < parts; ++p) {
      const Tensor& t = j.slots[j.stacked ? size_t(g) * parts + p : p];
      const int64_t rows = j.slot_rows[p];
      const char* src = static_cast<const char*>(t.raw()) + (j.stacked ? 0 : size_t(g * rows) * row_bytes);
      LINEAGE_CHECK(t.nbytes() == size_t(rows * (j.stacked ? 1 : j.groups)) * row_bytes, j.name, ": part ", p,
                    " has ", t.nbytes(), " bytes, not ", rows, " rows of ", row_bytes);
      std::memcpy(dst, src, size_t(rows) * row_bytes);
      dst += size_t(rows) * row_bytes;
    }
  return out;
}

}  // namespace

std::optional<UnstackSlot> unstack_slot(const BindingTable::Unstack& us, const std::string& name) {
  const size_t at = name.rfind(us.before);
  if (at == std::string::npos) return std::nullopt;
  const size_t digits = at + us.before.size();
  size_t end = digits;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == digits || end - digits > 9) return std::nullopt;
  int64_t row0 = 0;
  for (size_t p = 0; p < us.parts.size(); ++p) {
    if (name.compare(end, std::string::npos, us.parts[p].first) == 0)
      return UnstackSlot{name.substr(0, at) + us.stored, std::stoll(name.substr(digits, end - digits)), p, row0};
    row0 += us.parts[p].second;
  }
  return std::nullopt;
}

std::vector<std::pair<std::string, Tensor>> stored_tensors(const BindingTable& b,
                                                           const std::vector<std::pair<std::string, Tensor>>& params) {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<Joined> joined;
  std::map<std::string, size_t> joined_at;  // stored name → index in joined
  std::vector<std::pair<size_t, size_t>> order;  // (0, index in out) or (1, index in joined)
  for (const auto& [name, t] : params) {
    if (const std::optional<Place> pl = place_of(b, name)) {
      auto [it, fresh] = joined_at.emplace(pl->stored, joined.size());
      if (fresh) {
        joined.push_back({pl->stored, {}, pl->slot_rows, pl->groups, pl->stacked});
        order.emplace_back(1, it->second);
      }
      Joined& j = joined[it->second];
      if (j.slots.size() <= pl->slot) j.slots.resize(pl->slot + 1);
      j.slots[pl->slot] = t;
      continue;
    }
    order.emplace_back(0, out.size());
    out.emplace_back(stored_name(b, name), t.reshaped(stored_shape(b, name, t.shape())));
  }
  std::vector<std::pair<std::string, Tensor>> result;
  for (const auto& [kind, i] : order)
    if (kind == 0) result.push_back(std::move(out[i]));
    else result.emplace_back(joined[i].name, join(joined[i]));
  return result;
}

}  // namespace lineage::model
