# Writes a text file into a C++ header as one raw string literal: cmake -DINPUT=... -DOUTPUT=...
# -DNAME=... -P embed_text.cmake. The chat page of `lineage serve` is embedded this way, so the
# binary serves it with no file beside it.
file(READ ${INPUT} text)
string(FIND "${text}" ")lineage_embed\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter )lineage_embed\"")
endif()
file(WRITE ${OUTPUT}.tmp "// Generated from ${INPUT} by tools/embed_text.cmake; do not edit.\n#pragma once\n\ninline constexpr const char ${NAME}[] = R\"lineage_embed(${text})lineage_embed\";\n")
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUTPUT}.tmp)
