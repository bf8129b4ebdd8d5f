// Reading a user's text file whole, bounded: a path such as /dev/zero must not be read until
// memory runs out (a pipe is still allowed: `zoe train <(...)`). Read in pieces, so a small file
// costs no large zero-filled buffer.
#pragma once
#include <cstddef>
#include <istream>
#include <string>

namespace zoe {

// Appends what `in` holds to *text; false, with at least max_bytes + 1 bytes read, when it holds
// more than max_bytes.
bool read_at_most(std::istream& in, size_t max_bytes, std::string* text);

}  // namespace zoe
