#include "nvme/io_error.h"

#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "common/posix_io.h"

namespace zoe {

std::string errno_text(int err) {
  const char* name = strerrorname_np(err);
  return errno_string(err) + " (" + (name ? name : "?") + ", errno " + std::to_string(err) + ")";
}

std::string io_failure(const std::string& path, IoOp op, uint64_t offset, uint64_t bytes, int err) {
  return path + ": " + io_op_name(op) + " of " + std::to_string(bytes) + " bytes at offset " +
         std::to_string(offset) + " failed: " + errno_text(err);
}

std::string bytes_text(uint64_t bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u < 0)
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%llu bytes (%.1f %s)", static_cast<unsigned long long>(bytes), v, kUnits[u]);
  return buf;
}

std::string checksum_mismatch(const std::string& path, uint64_t block, uint64_t begin, uint64_t end,
                              uint64_t recorded, uint64_t got) {
  return fmt::format("{}: checksum mismatch in block {} (bytes {}..{}): xxh3 {:016x} when written, {:016x} read "
                     "back; the file was changed outside zoe or the device returned bad data",
                     path, block, begin, end - 1, recorded, got);
}

}  // namespace zoe
