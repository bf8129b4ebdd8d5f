// NvmeStore: the NVMe tier's files. A store is one directory per job and rank,
// <nvme_path>/zoe-<job>-rank<r>/ (the engine's job is rank 0's pid and 8 random hex digits),
// made by the store (mode 0700) and locked against a second store (flock) before anything is put
// in it, holding a marker (.zoe-lock) and one file per named region (<name>.swap), each created
// fresh (O_EXCL) and preallocated in full, so that once open() or add_regions()
// succeeded no write inside a region can fail for space. Callers read and write byte ranges of
// a region, of any size and offset, synchronously or asynchronously (a Ticket to wait on).
// Storage knows files and byte ranges, never tensors.
//
// One file per region, not one file with regions: regions are added as the engine learns what it
// homes on NVMe (one per kind of state: params, master, exp_avg, exp_avg_sq), each file grows and
// is checked for space on its own, a region's offsets are its file's offsets (no table to keep),
// and `ls -l` shows what each kind costs.
//
// Swap files are scratch: never fsynced, removed by close() (and by the destructor), and a
// region's blocks are zero until written. Errors name the file, the offset, the operation and the
// errno. Transfers touching the same aio.block_size block run in the order submitted; others may
// complete in any order. A caller's memory must stay valid until its transfer is waited for, and
// a write's unchanged: a read of bytes pending writes hold is served from their memory (see
// IoWorker), and `forwarded_bytes` counts it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/signal_exit.h"
#include "nvme/block_sums.h"
#include "nvme/nvme_env.h"
#include "nvme/pinned_pool.h"
#include "nvme/region_file.h"
#include "zoe/ledger.h"
#include "zoe/status.h"

namespace zoe {

class IoWorker;
struct Transfer;

// 32 random bits (getrandom) for a job's name, so that jobs whose rank 0 has the same pid (two
// containers on one host) get different directories; and the name: "<pid>-<8 hex digits>".
uint32_t swap_job_tag();
std::string swap_job_name(int64_t pid, uint32_t tag);

struct NvmeStoreOptions {
  std::string nvme_path;            // the store's directory is made inside (nvme_path itself too, if missing)
  std::string job = "job";          // names the directory: zoe-<job>-rank<rank> (see swap_job_name)
  int rank = 0;
  uint32_t block_size = 1 << 20;    // aio.block_size: bytes per request (DeepSpeed's default, 1 MiB)
  unsigned queue_depth = 8;         // aio.queue_depth: requests in flight (DeepSpeed's default, 8)
  bool checksums = true;            // zoe.checksums: xxh3-64 per block, verified on every read
  // Block-sized staging buffers for ranges or memory that O_DIRECT cannot take as they are
  // (unaligned offsets, tails, addresses); 0 means queue_depth. Taken from `pool` at open.
  unsigned bounce_buffers = 0;
  // Memory for the bounce buffers, and the buffers io_uring registers (when pinned): transfers to
  // and from a lease of this pool skip the kernel's per-request page pinning. Null: the store
  // makes a pool of just its bounce buffers (pinned when pin_memory, booked in `ledger`).
  PinnedPool* pool = nullptr;
  bool pin_memory = true;
  Ledger* ledger = nullptr;
  NvmeEnv* env = nullptr;           // null: NvmeEnv::Default()
};

// How one transfer runs. background: behind every other transfer (see Transfer::background);
// background transfers keep their order among themselves. sums: the sums of the blocks the range
// covers whole are the caller's (see BlockSums; sums.first and sums.count() must be
// caller_blocks() of the range): a write takes the caller's xxh3-64 of each such block as its
// sum, a read records the written sums there and leaves checking them (check_sum) to the caller;
// ignored without checksums. pad_last_block (writes): the bytes from the write's end to the end
// of its last block are padding nobody reads, so that block is written with zeros there instead
// of being read back first (read-modify-write) when the write does not cover it whole.
// landed: called on the I/O thread once the transfer has completed without error (a read: its
// bytes are in the caller's memory and checked), before any wait sees it done; it must not block
// (it hands the bytes on, e.g. queues a device copy) and is not called for a failed transfer.
struct TransferOptions {
  bool background = false;
  std::shared_ptr<BlockSums> sums;
  bool pad_last_block = false;
  std::function<void()> landed;
};

struct RegionSpec {
  std::string name;  // file <name>.swap; letters, digits, '_', '-', '.'
  uint64_t bytes = 0;
  // Where the caller's segments of data end, ascending, each followed by padding up to the next
  // block (where the next segment begins): the block holding an end stops there (its sum covers
  // the data, its requests run on to the next page), so the padding is never moved or hashed,
  // and no transfer may touch it (see BlockTable). Empty: blocks lie on the grid.
  std::vector<uint64_t> segment_ends = {};
};

// An asynchronous transfer; wait for it with NvmeStore::wait (once or more).
class Ticket {
 public:
  bool valid() const { return t_ != nullptr; }

 private:
  friend class NvmeStore;
  std::shared_ptr<Transfer> t_;
};

class NvmeStore {
 public:
  // Makes and locks the directory, removes what dead jobs left in nvme_path (see
  // remove_dead_jobs in nvme_store.cc), checks that the file system has room for all `regions`,
  // then creates and preallocates them. Refuses, before anything is written, with "needs X,
  // free Y" when they do not fit. A directory of this name it did not make (a link, another
  // owner's, a mode other than 0700, no marker) is Invalid, and left as it is.
  static Result<std::unique_ptr<NvmeStore>> open(const NvmeStoreOptions& o, std::span<const RegionSpec> regions = {});
  // Bytes on disk of the swap files dead jobs left in nvme_path: what the next open() there
  // removes before its free-space check (0 where the directory does not exist). Removes nothing.
  static Result<uint64_t> dead_jobs_bytes(const std::string& nvme_path, NvmeEnv* env = nullptr);
  ~NvmeStore();  // close(), errors dropped
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // More regions: the free-space check covers all of them before any is created.
  Status add_regions(std::span<const RegionSpec> regions);

  // Region ids are 0, 1, ... in the order added.
  Result<int> region(std::string_view name) const;
  int regions() const { return static_cast<int>(regions_.size()); }
  uint64_t region_bytes(int region) const { return regions_[region]->bytes; }
  const std::string& region_path(int region) const { return regions_[region]->path; }
  // Where a block stops at a segment's end (RegionSpec::segment_ends): rounded up to this.
  uint64_t segment_end_align(int region) const;
  const std::string& dir() const { return dir_.path; }
  uint32_t block_size() const { return o_.block_size; }
  unsigned queue_depth() const { return o_.queue_depth; }
  bool checksums() const { return o_.checksums; }

  // Bytes [offset, offset + bytes) of a region from or to the caller's memory. Any size, offset
  // and address; aligned ranges in aligned memory (best: a lease of the pool) move without a copy.
  Ticket read_async(int region, uint64_t offset, void* dst, uint64_t bytes, const TransferOptions& o = {});
  Ticket write_async(int region, uint64_t offset, const void* src, uint64_t bytes, const TransferOptions& o = {});
  // The blocks of a range a caller may hash itself: those it covers whole.
  WholeBlocks caller_blocks(int region, uint64_t offset, uint64_t bytes) const;
  // Corrupt, naming the file and the block, when a block the caller read does not hash to its sum.
  Status check_sum(int region, uint64_t block, uint64_t recorded, uint64_t got) const;
  Status wait(const Ticket& t);
  // Whether wait(t) would return at once.
  bool ready(const Ticket& t) const;
  // What the device has moved so far: whole requests, so padding, bounced block ends and
  // read-modify-write reads count (the figure to compare with what callers asked for).
  struct Traffic {
    uint64_t read_bytes = 0, written_bytes = 0;
    uint64_t hashed_bytes = 0;  // what the I/O thread hashed (callers' sums not counted)
    uint64_t forwarded_bytes = 0;  // what reads took from pending writes instead (not in read_bytes)
    uint64_t zero_filled_bytes = 0;  // what reads of never-written blocks gave as zeros (not in read_bytes)
  };
  Traffic traffic() const;
  // Returns once every transfer submitted so far has completed: traffic() is then final for them.
  void wait_idle();
  Status read(int region, uint64_t offset, void* dst, uint64_t bytes) { return wait(read_async(region, offset, dst, bytes)); }
  Status write(int region, uint64_t offset, const void* src, uint64_t bytes) {
    return wait(write_async(region, offset, src, bytes));
  }

  // Waits for every transfer, closes and removes the files and the directory, drops the lock.
  // Idempotent; the store accepts no transfer afterwards.
  Status close();

 private:
  NvmeStore() = default;
  Ticket submit(IoOp op, int region, uint64_t offset, uint8_t* user, uint64_t bytes, const TransferOptions& o);
  Status check_space(std::span<const RegionSpec> regions, uint64_t align);
  static std::string file_name(const std::string& region) { return region + ".swap"; }

  NvmeStoreOptions o_;
  NvmeEnv* env_ = nullptr;
  Dir parent_;            // nvme_path, links resolved
  Dir dir_;               // the store's directory; its descriptor holds the lock
  std::string dir_name_;  // its name in parent_
  SignalCleanup on_signal_;  // removes the directory's files if a signal ends the process
  bool closed_ = true;
  std::unique_ptr<PinnedPool> own_pool_;
  PinnedPool* pool_ = nullptr;
  std::vector<PinnedPool::Lease> bounce_;
  std::unique_ptr<IoQueue> queue_;
  std::unique_ptr<IoWorker> worker_;
  std::vector<std::unique_ptr<RegionFile>> regions_;
};

}  // namespace zoe
