#include "nvme/io_worker.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "common/profiler.h"
#include "nvme/io_error.h"

namespace zoe {

IoWorker::IoWorker(IoWorkerParams p)
    : queue_(p.queue), block_(p.block_bytes), registered_(p.registered), bounce_(std::move(p.bounce)) {
  for (int i = static_cast<int>(bounce_.size()) - 1; i >= 0; --i) free_bounce_.push_back(i);
  tasks_.resize(queue_->depth());
  for (int i = static_cast<int>(tasks_.size()) - 1; i >= 0; --i) free_slots_.push_back(i);
  thread_ = std::thread([this] { run(); });
}

IoWorker::~IoWorker() { stop(); }

void IoWorker::stop() {
  {
    std::lock_guard l(mu_);
    stopping_ = true;
  }
  work_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void IoWorker::submit(std::shared_ptr<Transfer> t) {
  t->submitted_us = Profiler::get().now_us();
  bool wake = false;
  {
    std::lock_guard l(mu_);
    if (!broken_.ok() || stopping_) {
      t->status = broken_.ok() ? Status::Runtime("NVMe store: transfer submitted after close") : broken_;
      t->done = true;
      return;
    }
    t->queued = true;
    ++outstanding_;
    incoming_.push_back(std::move(t));
    wake = in_kernel_;
  }
  work_.notify_one();
  if (wake) queue_->wake();  // the thread sleeps in the kernel waiting for an unrelated completion
}

Status IoWorker::wait(const Transfer& t) {
  std::unique_lock l(mu_);
  done_.wait(l, [&] { return t.done; });
  return t.status;
}

void IoWorker::wait_idle() {
  std::unique_lock l(mu_);
  done_.wait(l, [&] { return outstanding_ == 0; });
}

bool IoWorker::done(const Transfer& t) {
  std::lock_guard l(mu_);
  return t.done;
}

Status IoWorker::call(std::function<Status(IoQueue&)> fn) {
  Call c{std::move(fn), {}, false};
  bool wake = false;
  {
    std::lock_guard l(mu_);
    if (stopping_) return Status::Runtime("NVMe store: the I/O thread has stopped");
    calls_.push_back(&c);
    wake = in_kernel_;
  }
  work_.notify_one();
  if (wake) queue_->wake();
  std::unique_lock l(mu_);
  done_.wait(l, [&] { return c.done; });
  return c.result;
}

void IoWorker::run() {
  Profiler::name_thread("nvme io");
  {
    Status s = queue_->attach_thread();  // from here on the queue is this thread's alone
    std::lock_guard l(mu_);
    if (!s.ok()) broken_ = s;
  }
  std::vector<IoCompletion> cq;
  std::deque<std::shared_ptr<Transfer>> arrived;
  for (;;) {
    std::deque<Call*> calls;
    {
      std::unique_lock l(mu_);
      if (active_.empty() && background_.empty() && in_flight_ == 0) {
        work_.wait(l, [&] { return !incoming_.empty() || !calls_.empty() || stopping_; });
        if (incoming_.empty() && calls_.empty()) return;  // stopping, nothing left
      }
      arrived.swap(incoming_);
      calls.swap(calls_);
    }
    admit(arrived);
    if (!calls.empty()) {
      for (Call* c : calls) {
        Status s = broken_.ok() ? c->fn(*queue_) : broken_;
        std::lock_guard l(mu_);
        c->result = std::move(s);
        c->done = true;
      }
      done_.notify_all();
    }
    fill();
    if (in_flight_ == 0) continue;
    cq.clear();
    if (!to_hash_.empty()) {  // the writes go to the device first, then their sums are made
      Status s = queue_->submit_and_wait(0, &cq);
      if (!s.ok()) {
        to_hash_.clear();
        if (broken_.ok()) fail_all(s);
        else reap_failed(s);
        continue;
      }
      hash_pending();
    }
    bool block_in_kernel;
    {
      std::lock_guard l(mu_);
      block_in_kernel = incoming_.empty() && calls_.empty();  // new work waiting: submit without waiting
      in_kernel_ = block_in_kernel;
    }
    Status s = queue_->submit_and_wait(block_in_kernel && cq.empty() ? 1 : 0, &cq);
    {
      std::lock_guard l(mu_);
      in_kernel_ = false;
    }
    if (!s.ok()) {
      if (broken_.ok()) fail_all(s);
      else reap_failed(s);
      continue;
    }
    reap_failures_ = 0;
    handle_batch(cq);
  }
}

// A batch's reads are verified one by one. Once fewer than half the queue is in flight, the
// requests the handled ones freed are started after each hash, so the device is not idle while
// the rest of the batch is hashed (a batch can be the whole queue); above that they start at the
// batch's end, half the queue keeping the device busy meanwhile. A submit that fails in between
// is dealt with once the batch is handled.
void IoWorker::handle_batch(std::vector<IoCompletion>& cq) {
  Status late;
  for (size_t i = 0; i < cq.size(); ++i) {
    const uint64_t hashed = hashed_bytes_.load(std::memory_order_relaxed);
    handle(cq[i]);
    if (!late.ok() || i + 1 == cq.size() || hashed_bytes_.load(std::memory_order_relaxed) == hashed) continue;
    if (2 * in_flight_ >= static_cast<int>(tasks_.size())) continue;
    fill();
    if (!to_hash_.empty() || in_flight_ > 0) {
      late = queue_->submit_and_wait(0, &cq);
      if (late.ok()) hash_pending();
      else to_hash_.clear();
    }
  }
  if (late.ok()) return;
  if (broken_.ok()) fail_all(late);
  else reap_failed(late);
}

// Arrived transfers join the lists in submission order; a read pending writes cover is done at
// once (PendingWrites::serve), outside the lock: its copy holds up no submitter.
void IoWorker::admit(std::deque<std::shared_ptr<Transfer>>& arrived) {
  for (std::shared_ptr<Transfer>& t : arrived) {
    if (t->op == IoOp::kWrite) {
      pending_writes_.add(t);
    } else if (pending_writes_.serve(*t)) {
      forwarded_bytes_.fetch_add(t->bytes, std::memory_order_relaxed);
      t->queued = false;
      complete(*t);
      continue;
    }
    (t->background ? background_ : active_).push_back(std::move(t));
  }
  arrived.clear();
}

// Foreground transfers first; background ones only while no foreground transfer has blocks to
// hand out, in batches (background_room): a foreground request arriving then waits for one batch,
// not for a full queue. Among the foreground, reads go first (transfer_order.h).
void IoWorker::fill() {
  constexpr size_t kUnknown = ~size_t{0};
  size_t background_room = kUnknown;  // asked once no foreground block is left to start
  retire(active_);  // transfers failed elsewhere (fail_all); start_foreground retires its own
  for (;;) {
    if (!active_.empty()) {
      if (free_slots_.empty() || start_foreground() == Start::kStalled) return;
      continue;
    }
    retire(background_);
    if (background_.empty()) return;
    if (background_room == kUnknown) background_room = this->background_room();
    if (free_slots_.empty() || background_room == 0) return;
    const Start started = start_block(background_.front());
    if (started == Start::kStarted) {
      --background_room;
    } else if (!fail_if_nothing_in_flight(*background_.front())) {
      return;
    }
  }
}

// Transfers with nothing more to hand out leave the list (complete once nothing is in flight).
void IoWorker::retire(TransferList& list) {
  for (size_t i = 0; i < list.size();)
    if (!retire_at(list, i)) ++i;
}

bool IoWorker::retire_at(TransferList& list, size_t i) {
  Transfer& t = *list[i];
  if (!t.failed && t.scheduled < t.bytes) return false;
  t.queued = false;
  if (t.in_flight == 0) complete(t);
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
  return true;
}

// The next foreground block: the earliest read that may start, else the earliest write
// (transfer_order.h). A transfer it leaves with nothing more to hand out retires at once.
IoWorker::Start IoWorker::start_foreground() {
  for (IoOp op : {IoOp::kRead, IoOp::kWrite}) {
    const int i = earliest_startable(active_, op);
    if (i < 0 || start_block(active_[i]) != Start::kStarted) continue;
    retire_at(active_, static_cast<size_t>(i));
    return Start::kStarted;
  }
  // Something in flight holds what the candidates need (their block, or every bounce buffer): its
  // completion unblocks them. With nothing in flight, nothing ever will.
  if (!fail_if_nothing_in_flight(*active_.front())) return Start::kStalled;
  retire_at(active_, 0);
  return Start::kStarted;
}

bool IoWorker::fail_if_nothing_in_flight(Transfer& t) {
  if (in_flight_ > 0) return false;
  t.failed = true;
  t.status = Status::Runtime("NVMe store: a transfer cannot start (no bounce buffer)");
  return true;
}

static BlockSums* caller_block(const Transfer& t, uint64_t block);

IoWorker::Start IoWorker::start_block(const std::shared_ptr<Transfer>& tp) {
  Transfer& t = *tp;
  RegionFile& r = *t.region;
  const BlockPlan p = plan_block(t, r, block_);
  uint8_t* user = t.user + (p.user_begin - t.offset);
  const BlockTable::State state = r.blocks.state(p.block);

  if (t.op == IoOp::kRead && state == BlockTable::State::kFailed) {
    t.failed = true;
    if (t.status.ok())
      t.status = Status::Corrupt(fmt::format("{}: block {} (bytes {}..{}) cannot be read: its last write failed, so "
                                             "its contents are undefined",
                                             r.path, p.block, r.blocks.begin(p.block), r.blocks.end(p.block) - 1));
    return Start::kStarted;
  }
  for (const Task& k : tasks_)
    if (k.t && k.t->region == t.region && k.plan.block == p.block) return Start::kStalled;
  if (t.op == IoOp::kRead && state == BlockTable::State::kUnwritten) {
    // Never written (and no write of it in flight: checked above): the fresh, preallocated file
    // holds zeros there, so the bytes are zeros without a request. The file system would only
    // have zero-filled them too (ext4's unwritten extents), yet counted as a read of the device.
    std::memset(user, 0, p.user_bytes());
    if (BlockSums* c = caller_block(t, p.block)) {
      c->sums[p.block - c->first] = 0;
      c->check[p.block - c->first] = 0;
    }
    t.scheduled += p.user_bytes();
    zero_filled_bytes_.fetch_add(p.user_bytes(), std::memory_order_relaxed);
    return Start::kStarted;
  }
  if (!p.direct && free_bounce_.empty()) return Start::kStalled;

  const int slot = free_slots_.back();
  free_slots_.pop_back();
  Task& k = tasks_[slot];
  k = Task{};
  k.t = tp;
  k.plan = p;
  k.user = user;
  if (p.direct) {
    k.io_buf = user;
  } else {
    k.bounce = free_bounce_.back();
    free_bounce_.pop_back();
    k.io_buf = bounce_[k.bounce];
  }
  k.buf_index = registered_ ? registered_->piece_of(k.io_buf, p.io_bytes()) : -1;
  t.scheduled += p.user_bytes();
  ++t.in_flight;
  ++in_flight_;
  if (t.background) ++background_in_flight_;

  if (t.op == IoOp::kRead || p.read_first) {
    k.phase = IoOp::kRead;  // a read-modify-write reads the rest of its span first
  } else {
    if (!p.direct) stage_write(p, k.io_buf, user);
    if (r.blocks.checksums()) set_write_sum(slot);
    k.phase = IoOp::kWrite;
  }
  enqueue(slot);
  return Start::kStarted;
}

void IoWorker::enqueue(int slot) {
  Task& k = tasks_[slot];
  IoRequest req;
  req.op = k.phase;
  req.file = k.t->region->queue_file;
  req.offset = k.plan.io_begin + k.done;
  req.buf = k.io_buf + k.done;
  req.bytes = k.plan.io_bytes() - k.done;
  req.buf_index = k.buf_index;
  req.tag = static_cast<uint64_t>(slot);
  req.batched = k.t->background;  // background_room(): batches that merge
  Status s = queue_->enqueue(req);
  if (!s.ok()) fail(slot, Status::Io(k.t->region->path + ": " + s.message()));
}

void IoWorker::handle(const IoCompletion& c) {
  const int slot = static_cast<int>(c.tag);
  Task& k = tasks_[slot];
  const RegionFile& r = *k.t->region;
  if (!broken_.ok()) {  // the queue failed while this was in flight: nothing more goes out for it
    fail(slot, broken_);
    return;
  }
  if (c.result < 0) {
    const int err = -c.result;
    if (err == EAGAIN || err == EINTR) {  // the kernel asks to try again: same request
      enqueue(slot);
      return;
    }
    fail(slot, Status::Io(io_failure(r.path, k.phase, k.plan.io_begin + k.done, k.plan.io_bytes() - k.done, err)));
    return;
  }
  if (c.result == 0) {
    fail(slot, Status::Io(fmt::format("{}: {} of {} bytes at offset {} transferred nothing (end of file?)", r.path,
                                      io_op_name(k.phase), k.plan.io_bytes() - k.done, k.plan.io_begin + k.done)));
    return;
  }
  k.done += static_cast<uint32_t>(c.result);
  if (k.done < k.plan.io_bytes()) {  // short transfer: the rest, from where it stopped
    enqueue(slot);
    return;
  }
  (k.phase == IoOp::kRead ? read_bytes_ : written_bytes_).fetch_add(k.plan.io_bytes(), std::memory_order_relaxed);
  if (k.phase == IoOp::kRead) {
    if (!verify(slot)) return;
    if (k.plan.read_first) {  // patch the caller's bytes in and write the span back
      patch_write(k.plan, k.io_buf, k.user);
      if (r.blocks.checksums()) to_hash_.push_back(slot);  // made once the write is on the device
      k.phase = IoOp::kWrite;
      k.done = 0;
      enqueue(slot);
      return;
    }
    if (k.bounce >= 0) unstage_read(k.plan, k.io_buf, k.user);
  } else {
    // A block whose last write failed becomes valid again only when a write covers all of it.
    const uint64_t block_begin = r.blocks.begin(k.plan.block);
    const uint64_t block_end = std::min<uint64_t>(r.blocks.end(k.plan.block), r.bytes);
    RegionFile& rw = *k.t->region;
    if (rw.blocks.state(k.plan.block) != BlockTable::State::kFailed ||
        (k.plan.user_begin == block_begin &&
         (k.plan.user_end == block_end || pads_rest(*k.t, k.plan.io_begin, k.plan.user_begin, k.plan.user_end))))
      rw.blocks.set_written(k.plan.block, k.sum);
  }
  finish(slot);
}

// The caller's sums when it covers `block` whole and said it hashes it, else null.
static BlockSums* caller_block(const Transfer& t, uint64_t block) {
  BlockSums* c = t.caller_sums.get();
  return c && block >= c->first && block - c->first < c->count() ? c : nullptr;
}

uint64_t IoWorker::hash(const uint8_t* data, size_t bytes) {
  hashed_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return BlockTable::hash(data, bytes);
}

// A write's block sum: the caller's where it made it; else hashed here, once the write is on its
// way to the device (hash_pending), so the device does not wait for the hash.
void IoWorker::set_write_sum(int slot) {
  Task& k = tasks_[slot];
  if (const BlockSums* c = caller_block(*k.t, k.plan.block)) k.sum = c->sums[k.plan.block - c->first];
  else to_hash_.push_back(slot);
}

// Before any completion is handled: a write's sum is recorded when it completes.
void IoWorker::hash_pending() {
  for (int slot : to_hash_) {
    Task& k = tasks_[slot];
    if (k.t && k.phase == IoOp::kWrite) k.sum = hash(k.io_buf, k.t->region->blocks.end(k.plan.block) - k.plan.io_begin);
  }
  to_hash_.clear();
}

bool IoWorker::verify(int slot) {
  Task& k = tasks_[slot];
  const RegionFile& r = *k.t->region;
  if (!r.blocks.checksums()) return true;
  const bool written = r.blocks.state(k.plan.block) == BlockTable::State::kWritten;
  if (BlockSums* c = caller_block(*k.t, k.plan.block)) {  // the caller checks it where it uses it
    c->sums[k.plan.block - c->first] = written ? r.blocks.sum(k.plan.block) : 0;
    c->check[k.plan.block - c->first] = written;
    return true;
  }
  if (!written) return true;
  const uint64_t got = hash(k.io_buf, r.blocks.end(k.plan.block) - k.plan.io_begin);
  if (got == r.blocks.sum(k.plan.block)) return true;
  fail(slot, Status::Corrupt(checksum_mismatch(r.path, k.plan.block, k.plan.io_begin, r.blocks.end(k.plan.block),
                                               r.blocks.sum(k.plan.block), got)));
  return false;
}

void IoWorker::fail(int slot, Status s) {
  Task& k = tasks_[slot];
  Transfer& t = *k.t;
  // The bytes of a block whose write failed are undefined; reads of it fail until it is rewritten.
  if (k.phase == IoOp::kWrite) t.region->blocks.set_failed(k.plan.block);
  if (t.status.ok()) t.status = std::move(s);
  t.failed = true;
  finish(slot);
}

// Linux's largest request on the virtio disks here (max_sectors_kb 4096); NVMe drives take less
// per command, and the kernel splits a larger request for them.
constexpr size_t kMergedRequestBytes = size_t{4} << 20;
constexpr size_t kBackgroundBytes = size_t{16} << 20;

// Background blocks go out a batch at a time: submitted in one system call, neighbouring blocks
// merge into one request of the disk, so a virtual disk takes one notification and raises one
// interrupt for the batch instead of one per block (each costs a VM exit). A batch is what one
// disk request holds (kMergedRequestBytes), at most half the queue. Whole batches follow each
// other without the queue draining in between, up to kBackgroundBytes in flight (at least one),
// beside the last foreground requests of a transfer too (fill() asks only once no foreground
// block is left to start): waiting for the queue to drain before each batch left the disk
// half-idle at every foreground transfer's tail and between batches. A foreground request that
// arrives waits for at most kBackgroundBytes.
size_t IoWorker::background_room() const {
  const size_t half = std::max<size_t>(1, tasks_.size() / 2);
  const size_t batch = std::clamp<size_t>(kMergedRequestBytes / block_, 1, half);
  const size_t most = std::max(batch, std::min(half, kBackgroundBytes / block_));
  const size_t busy = static_cast<size_t>(background_in_flight_);
  return busy + batch <= most ? (most - busy) / batch * batch : 0;  // whole batches
}

void IoWorker::finish(int slot) {
  Task& k = tasks_[slot];
  std::shared_ptr<Transfer> tp = std::move(k.t);
  if (k.bounce >= 0) free_bounce_.push_back(k.bounce);
  k = Task{};
  free_slots_.push_back(slot);
  --in_flight_;
  if (tp->background) --background_in_flight_;
  if (--tp->in_flight == 0 && !tp->queued) complete(*tp);
}

void IoWorker::complete(Transfer& t) {
  if (t.op == IoOp::kWrite) pending_writes_.remove(t);  // no read may take its memory from here on
  if (Profiler::get().tracing()) {
    const char* cat = t.op == IoOp::kRead ? "nvme_read" : "nvme_write";
    Profiler::get().record(cat, cat, Bucket::kNone, t.submitted_us, Profiler::get().now_us());
  }
  if (t.landed && !t.failed && t.status.ok()) t.landed();  // before a waiter can see it done
  {
    std::lock_guard l(mu_);
    t.done = true;
    --outstanding_;
  }
  done_.notify_all();
}

// The queue itself failed (not one request): nothing more is submitted, and every transfer
// fails. One not started yet fails now; one with requests the kernel took fails only once all of
// them have completed (run() goes on reaping): until then the kernel may still write into their
// memory or read from it, so neither the caller's memory nor a bounce buffer is handed back.
void IoWorker::fail_all(const Status& s) {
  to_hash_.clear();  // nothing those writes record matters now
  std::deque<std::shared_ptr<Transfer>> waiting;
  {
    std::lock_guard l(mu_);
    broken_ = s;
    waiting.swap(incoming_);
  }
  for (auto& t : waiting) active_.push_back(std::move(t));
  for (auto& t : background_) active_.push_back(std::move(t));
  background_.clear();
  for (auto& t : active_) {
    t->failed = true;
    if (t->status.ok()) t->status = s;
  }
  for (Task& k : tasks_) {
    if (!k.t) continue;
    k.t->failed = true;
    if (k.t->status.ok()) k.t->status = s;
  }
  fill();  // completes every failed transfer with nothing in flight
}

// Reaping after a queue failure failed too. Tried again after a pause growing to 100 ms; after
// kReapAttempts in a row (about 2 s) the kernel's requests are abandoned: their transfers fail
// saying so, and their bounce buffers are never reused (abandoned_bounce; the store leaks them
// rather than give them back to the pool). The ring's teardown waits for the requests, but
// asynchronously: memory handed back after it could still be written.
void IoWorker::reap_failed(const Status& s) {
  constexpr int kReapAttempts = 25;
  if (++reap_failures_ < kReapAttempts) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, 1 << std::min(reap_failures_, 7))));
    return;
  }
  const std::string why = fmt::format("{}; reaping the requests in flight failed {} times ({}): abandoned, "
                                      "the kernel may still use their memory",
                                      broken_.message(), reap_failures_, s.message());
  for (int slot = 0; slot < static_cast<int>(tasks_.size()); ++slot) {
    Task& k = tasks_[slot];
    if (!k.t) continue;
    if (k.bounce >= 0) abandoned_bounce_.push_back(k.bounce);
    k.bounce = -1;
    k.t->status = Status::Io(why);
    fail(slot, Status::Io(why));
  }
}

}  // namespace zoe
