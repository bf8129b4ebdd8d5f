#include "common/json_depth.h"

#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace zoe {

bool json_deeper_than(const nlohmann::json& j, size_t max_depth) {
  std::vector<std::pair<const nlohmann::json*, size_t>> todo = {{&j, 0}};  // value, its depth
  while (!todo.empty()) {
    auto [v, depth] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    if (depth + 1 > max_depth) return true;
    for (const nlohmann::json& child : *v) todo.emplace_back(&child, depth + 1);
  }
  return false;
}

}  // namespace zoe
