// UringEnv: the real NvmeEnv — POSIX file calls and io_uring queues.
#pragma once
#include "nvme/nvme_env.h"

namespace zoe {

class UringEnv : public NvmeEnv {
 public:
  Status create_dir(const std::string& path) override;
  Result<int> lock_dir(const std::string& path) override;
  Result<std::vector<std::string>> list_dir(const std::string& path) override;
  Result<DirectFile> open_direct(const std::string& path) override;
  Status allocate(int fd, const std::string& path, uint64_t bytes) override;
  Result<uint64_t> free_bytes(const std::string& path) override;
  Status remove_file(const std::string& path) override;
  Status remove_dir(const std::string& path) override;
  void close_fd(int fd) override;
  Result<std::unique_ptr<IoQueue>> new_queue(unsigned depth) override;
};

}  // namespace zoe
