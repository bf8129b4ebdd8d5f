// Build facts reported by `zoe info`.
#pragma once
#include <string>
#include <vector>

namespace zoe {
const char* version_string();
std::vector<std::string> backends_compiled();  // "cpu", and "cuda" when built with nvcc
}  // namespace zoe
