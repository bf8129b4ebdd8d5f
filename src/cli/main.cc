// zoe: one binary, subcommands (contracts.md). Filled in by the CLI work.
#include <cstdio>
#include "common/version.h"
int main(int argc, char** argv) {
  std::printf("zoe %s\n", zoe::version_string());
  return 0;
}
