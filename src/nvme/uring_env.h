// UringEnv: the real NvmeEnv — POSIX file calls and io_uring queues.
#pragma once
#include "nvme/nvme_env.h"

namespace zoe {

class UringEnv : public NvmeEnv {
 public:
  Status create_dir(const std::string& path) override;
  Result<std::string> resolve(const std::string& path, bool* was_link) override;
  Result<Dir> open_dir(const std::string& path) override;
  Result<bool> make_dir_at(const Dir& dir, const std::string& name) override;
  Result<Dir> open_dir_at(const Dir& dir, const std::string& name) override;
  Result<EntryInfo> stat_at(const Dir& dir, const std::string& name) override;
  Status make_private(const Dir& dir) override;
  Result<bool> try_lock(const Dir& dir) override;
  Status create_file_at(const Dir& dir, const std::string& name) override;
  Result<std::vector<std::string>> list_dir(const Dir& dir) override;
  Result<DirectFile> create_direct_at(const Dir& dir, const std::string& name) override;
  Status allocate(int fd, const std::string& path, uint64_t bytes) override;
  Result<uint64_t> free_bytes(const Dir& dir) override;
  Status remove_file_at(const Dir& dir, const std::string& name) override;
  Status remove_dir_at(const Dir& dir, const std::string& name) override;
  void close_fd(int fd) override;
  Result<std::unique_ptr<IoQueue>> new_queue(unsigned depth) override;
};

}  // namespace zoe
