#include "common/version.h"

namespace zoe {
const char* version_string() { return "0.1.0"; }
std::vector<std::string> backends_compiled() {
  std::vector<std::string> b{"cpu"};
#ifdef ZOE_HAVE_CUDA
  b.push_back("cuda");
#endif
  return b;
}
}  // namespace zoe
