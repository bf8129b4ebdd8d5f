// How the NVMe tier words a failed system call: every message names the errno by its text, its
// symbol and its number ("No space left on device (ENOSPC, errno 28)"), so logs can be grepped
// for either.
#pragma once
#include <cstdint>
#include <string>

#include "nvme/io_queue.h"

namespace zoe {

// "No space left on device (ENOSPC, errno 28)"
std::string errno_text(int err);

// "<path>: write of 65536 bytes at offset 196608 failed: Input/output error (EIO, errno 5)"
std::string io_failure(const std::string& path, IoOp op, uint64_t offset, uint64_t bytes, int err);

// "<path>: checksum mismatch in block 3 (bytes 196608..262143): xxh3 ... when written, ... read back; ..."
std::string checksum_mismatch(const std::string& path, uint64_t block, uint64_t begin, uint64_t end,
                              uint64_t recorded, uint64_t got);

// "16777216 bytes (16.0 MiB)"
std::string bytes_text(uint64_t bytes);

}  // namespace zoe
