// Thin POSIX I/O helpers that retry on EINTR and on short reads/writes and report failures as
// Status values naming the path and strerror.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/unique_fd.h"
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

// The directory part of `path` ("." for a bare name), and the part after the last '/'.
std::string parent_dir(const std::string& path);
std::string base_name(const std::string& path);

// What a stat mode is, in words: "a regular file", "a FIFO", "a character device", ...
std::string file_kind(unsigned mode);

// A file opened to be read, and its size when opened.
struct InputFile {
  UniqueFd fd;
  uint64_t size = 0;
};
enum class Links { kFollow, kRefuse };
// Opens `path` to read, checked on the opened descriptor: a regular file only (a FIFO, device,
// socket or directory is Invalid naming what it is; the open never blocks, as a FIFO's would), at
// most `max_bytes` long (Invalid naming both sizes). A final symlink is refused (ELOOP) when
// `links` is kRefuse. `what` names the file's role, e.g. "config key 'zoe.init'".
Result<InputFile> open_input_file(const std::string& path, const std::string& what, uint64_t max_bytes,
                                  Links links = Links::kFollow);

// Creates `path` and its missing parents as directories of mode 0700, whatever the umask. Those that
// exist are left as they are; one that is not a directory is Invalid.
Status make_private_dirs(const std::string& path);

// OK when `name` in the directory `dirfd` is absent or a regular file: the only things a file zoe
// writes may replace. A link, device, FIFO, socket or directory there is Invalid naming `path`.
Status check_replaceable(int dirfd, const std::string& name, const std::string& path);

}  // namespace zoe
