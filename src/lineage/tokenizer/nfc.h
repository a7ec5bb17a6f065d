// Unicode Normalization Form C (UAX #15), the "NFC" normalizer of tokenizer.json. Must match Python's
// unicodedata.normalize("NFC", s) (whose tables unicode_nfc.cpp holds) and JavaScript's
// String.prototype.normalize("NFC") of the same Unicode version.
#pragma once

#include <string>
#include <string_view>

namespace lineage::tokenizer {

// The NFC of UTF-8 text: canonical decomposition (Hangul syllables algorithmically), canonical
// ordering, canonical composition. All-ASCII text comes back unchanged at once. A byte that does not
// start a valid UTF-8 sequence passes through unchanged and acts as a starter that composes with
// nothing (as a lone surrogate does in Python and JavaScript): nothing reorders or composes across it.
std::string nfc(std::string_view utf8);

}  // namespace lineage::tokenizer
