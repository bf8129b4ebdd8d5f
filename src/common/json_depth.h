// nlohmann's parser is iterative, but dump() and every recursive walk of a parsed value (the
// config's flatten, an error message quoting the value) recurse once per nesting level, so a
// hostile "[[[[...]]]]" of a few hundred KB overflows the stack. Parsers of outside files reject
// anything nested deeper than any real file of theirs right after parsing, with this check,
// which itself does not recurse.
#pragma once
#include <cstddef>

#include <nlohmann/json_fwd.hpp>

namespace zoe {

// Far deeper than any config, manifest or safetensors header (they nest 3 or 4 levels).
inline constexpr size_t kMaxJsonDepth = 64;

// True when containers nest more than max_depth levels (a scalar has depth 0, [] depth 1).
bool json_deeper_than(const nlohmann::json& j, size_t max_depth);

}  // namespace zoe
