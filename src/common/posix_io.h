// Thin POSIX I/O helpers that retry on EINTR and on short reads/writes and report failures as
// Status values naming the path and strerror.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "zoe/status.h"

namespace zoe {

// strerror(err) as a string (thread-safe).
std::string errno_string(int err);

// Status for a failed open()/stat() of `path`: Invalid for a path the user got wrong (ENOENT,
// ENOTDIR, EACCES, EISDIR, ENAMETOOLONG, ELOOP), Io otherwise. `what` says what was attempted.
Status open_error(const std::string& path, const std::string& what, int err);

// Writes all n bytes (looping over short writes); Io naming `path` on any failure, e.g. ENOSPC.
Status write_all(int fd, const void* data, size_t n, const std::string& path);

// Reads exactly n bytes at `offset`; Io naming `path` on failure or end of file before n bytes.
Status pread_all(int fd, void* buf, size_t n, uint64_t offset, const std::string& path);

// Reads up to n bytes from the current position, stopping early only at end of file.
Result<size_t> read_upto(int fd, void* buf, size_t n, const std::string& path);

Status fsync_fd(int fd, const std::string& path);

// Opens the directory and fsyncs it, so that entries created or renamed in it are durable.
Status fsync_dir(const std::string& dir);

// The directory part of `path` ("." for a bare name).
std::string parent_dir(const std::string& path);

}  // namespace zoe
