// The config keys users read about are the keys zoe accepts: docs/REFERENCE.md's "Config (JSON)"
// section, every key of its tables and of its "accepted without effect" list, against
// known_config_keys() and accepted_no_effect_config_keys(). A key added to config.cc without a
// line in the reference fails here, and so does a documented key zoe no longer takes.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "common/config.h"

namespace zoe {
namespace {

std::string config_section() {
  std::ifstream f(std::string(ZOE_SOURCE_DIR) + "/docs/REFERENCE.md");
  std::stringstream all;
  all << f.rdbuf();
  std::string text = all.str();
  size_t begin = text.find("\n## Config (JSON)");
  size_t end = text.find("\n## ", begin + 1);
  return begin == std::string::npos ? "" : text.substr(begin, end - begin);
}

// `a.{x, y}` -> a.x, a.y; `a` -> a.
void expand(const std::string& name, std::set<std::string>* out) {
  size_t brace = name.find('{');
  if (brace == std::string::npos) {
    out->insert(name);
    return;
  }
  std::string prefix = name.substr(0, brace), list = name.substr(brace + 1, name.find('}') - brace - 1);
  std::stringstream items(list);
  for (std::string item; std::getline(items, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    out->insert(prefix + item);
  }
}

// The keys the section documents: each table's first cell (zero_optimization's table names its
// keys without the prefix; `.pin_memory` after `a.b` means `a.pin_memory`), and the backticked
// names of the "Accepted without effect" paragraph.
std::set<std::string> documented_keys() {
  std::set<std::string> keys;
  std::stringstream lines(config_section());
  bool zero_table = false, in_table = false;
  std::string no_effect;  // the paragraph, joined: its brace lists run over lines
  const std::regex code("`([^`]+)`");
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("`zero_optimization.*`")) zero_table = true;
    if (line.starts_with("Accepted without effect") || !no_effect.empty()) {
      no_effect += " " + line;
      continue;
    }
    if (!line.starts_with("|")) {
      if (in_table) zero_table = false;  // the table after the zero_optimization line ended
      in_table = false;
      continue;
    }
    in_table = true;
    if (!line.starts_with("| `")) continue;
    std::string first = line.substr(1, line.find('|', 1) - 1), previous;
    for (std::sregex_iterator m(first.begin(), first.end(), code), e; m != e; ++m) {
      std::string k = (*m)[1];
      if (k.starts_with(".")) k = previous.substr(0, previous.rfind('.')) + k;
      previous = k;
      keys.insert(zero_table && !k.starts_with("aio.") ? "zero_optimization." + k : k);
    }
  }
  for (std::sregex_iterator m(no_effect.begin(), no_effect.end(), code), e; m != e; ++m) expand((*m)[1], &keys);
  return keys;
}

TEST(ConfigDocs, EveryAcceptedKeyIsDocumentedAndEveryDocumentedKeyAccepted) {
  std::set<std::string> documented = documented_keys();
  ASSERT_GT(documented.size(), 50u) << "docs/REFERENCE.md's Config section was not found or not parsed";
  std::set<std::string> accepted(known_config_keys().begin(), known_config_keys().end());
  accepted.insert(accepted_no_effect_config_keys().begin(), accepted_no_effect_config_keys().end());
  for (const auto& k : accepted) EXPECT_TRUE(documented.count(k)) << k << " is accepted but not in docs/REFERENCE.md";
  for (const auto& k : documented) EXPECT_TRUE(accepted.count(k)) << k << " is in docs/REFERENCE.md but not accepted";
}

}  // namespace
}  // namespace zoe
