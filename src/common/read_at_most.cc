#include "common/read_at_most.h"

namespace zoe {

bool read_at_most(std::istream& in, size_t max_bytes, std::string* text) {
  const size_t start = text->size();
  char piece[1 << 16];
  while (text->size() - start <= max_bytes && in.read(piece, sizeof piece).gcount() > 0)
    text->append(piece, static_cast<size_t>(in.gcount()));
  return text->size() - start <= max_bytes;
}

}  // namespace zoe
