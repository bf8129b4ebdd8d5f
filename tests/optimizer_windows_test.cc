// OptimizerWindows on its own, with a step that stands in for Adam: each sub-group is stepped in
// a window holding its state, in order, and written back before it is reported done; the next
// pass starts from what was read ahead; what was read ahead is dropped when the state changes
// behind it; a write-only array's window is zero wherever the step writes nothing.
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "cpu/cpu_device.h"
#include "nvme/nvme_store.h"
#include "nvme/pinned_pool.h"
#include "sched/optimizer/optimizer_windows.h"
#include "sched/state_array.h"
#include "test_util.h"

namespace zoe {
namespace {

constexpr uint32_t kBlock = 4096;

class OptimizerWindowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::make_temp_dir("optimizer-windows");
    auto pool = PinnedPool::create({4 << 20, /*pin=*/false, &dev_.ledger()});
    ASSERT_TRUE(pool.ok()) << pool.status().message();
    pool_ = std::move(pool).value();
    ASSERT_TRUE(dev_.register_host(pool_->base(), pool_->capacity()).ok());
    NvmeStoreOptions o;
    o.nvme_path = dir_;
    o.job = "windows";
    o.block_size = kBlock;
    o.ledger = &dev_.ledger();
    o.pool = pool_.get();
    auto store = NvmeStore::open(o);
    ASSERT_TRUE(store.ok()) << store.status().message();
    store_ = std::move(store).value();
    // Three units (the sub-groups below) of fp32 state and of bf16-sized weights, all on NVMe.
    ASSERT_TRUE(state_.allocate(dev_, {Tier::kNvme, 1.0, store_.get(), "state"}, kElems, 4, Kind::kExpAvg, kUnits).ok());
    ASSERT_TRUE(weights_.allocate(dev_, {Tier::kNvme, 1.0, store_.get(), "weights"}, kElems, 2, Kind::kParam, kUnits).ok());
    layout_.arrays.push_back({1, &state_, /*read=*/true, 0, /*hot_sums=*/false});
    layout_.arrays.push_back({3, &weights_, /*read=*/false, 4, /*hot_sums=*/false});
    layout_.per_elem = 6;
    layout_.pool_keep_per_elem = 6 * 5;  // what a next pass would need: leaves room to read it all ahead
    // Garbage in every free byte of the pool, so that a window holds some where nobody writes.
    auto all = pool_->try_acquire(pool_->available());
    ASSERT_TRUE(all.ok() && all->data());
    std::memset(all->data(), 0xAB, all->size());
    windows_ = std::make_unique<OptimizerWindows>(dev_, *pool_, [](int64_t) { return true; });
  }
  void TearDown() override {
    windows_.reset();
    state_.release(dev_);
    weights_.release(dev_);
    (void)store_->close();
    dev_.unregister_host(pool_->base());
  }

  // Whole arrays, a unit at a time (no transfer crosses a unit: the padding between is not theirs).
  template <typename T>
  std::vector<T> get(const StateArray& a) {
    std::vector<T> v(kElems);
    for (auto [lo, hi] : kGroups) EXPECT_TRUE(a.wait(a.read_async(lo, hi - lo, v.data() + lo)).ok());
    return v;
  }
  template <typename T>
  void put(StateArray& a, const std::vector<T>& v) {
    for (auto [lo, hi] : kGroups) {
      Status st = a.wait(a.write_async(lo, hi - lo, v.data() + lo));
      ASSERT_TRUE(st.ok()) << st.message();
    }
  }
  std::vector<float> state() { return get<float>(state_); }
  void set_state(const std::vector<float>& v) { put(state_, v); }

  // One pass: the step adds 1 to the state and writes 7 into the weights where Adam would write.
  Status pass(std::vector<std::pair<int64_t, int64_t>>* stepped, std::vector<int64_t>* advanced) {
    auto step = [&](int64_t a, int64_t b, const std::array<char*, 4>& w, const std::vector<HashedArray>*) {
      EXPECT_NE(w[1], nullptr);
      EXPECT_NE(w[3], nullptr);
      float* s = reinterpret_cast<float*>(w[1]);
      for (int64_t i = 0; i < b - a; ++i) s[i] += 1.0f;
      for (auto [lo, hi] : kWritten)
        for (int64_t e = std::max(lo, a); e < std::min(hi, b); ++e) std::memcpy(w[3] + (e - a) * 2, "\x07\x00", 2);
      stepped->push_back({a, b});
      return Status::Ok();
    };
    return windows_->run(kGroups, kWritten, layout_, step, [&](int64_t b) { advanced->push_back(b); });
  }

  static constexpr int64_t kElems = 3000;
  const std::vector<int64_t> kUnits = {0, 1200, 2200};
  const SubGroups kGroups = {{0, 1200}, {1200, 2200}, {2200, 3000}};
  // Where the step writes the weights: not [1100, 1200) nor [2900, 3000) (padding, say).
  const std::vector<std::pair<int64_t, int64_t>> kWritten = {{0, 1100}, {1200, 2900}};
  std::string dir_;
  CpuDevice dev_{1 << 20, 1 << 20, /*strict=*/false};
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<NvmeStore> store_;
  StateArray state_, weights_;
  WindowLayout layout_;
  std::unique_ptr<OptimizerWindows> windows_;
};

TEST_F(OptimizerWindowsTest, EverySubGroupIsSteppedInItsWindowAndWrittenBack) {
  std::vector<float> v(kElems);
  for (int64_t i = 0; i < kElems; ++i) v[i] = static_cast<float>(i);
  set_state(v);
  // Garbage in the weights' region: the pass must overwrite every element, padding with zeros.
  std::vector<uint16_t> junk(kElems, 0xBEEF);
  put(weights_, junk);
  for (int p = 1; p <= 3; ++p) {
    SCOPED_TRACE(p);
    std::vector<std::pair<int64_t, int64_t>> stepped;
    std::vector<int64_t> advanced;
    ASSERT_TRUE(pass(&stepped, &advanced).ok());
    EXPECT_EQ(stepped, kGroups);
    EXPECT_EQ(advanced, (std::vector<int64_t>{1200, 2200, 3000}));
    const std::vector<float> s = state();
    for (int64_t i = 0; i < kElems; ++i) ASSERT_EQ(s[i], v[i] + p) << i;
    const std::vector<uint16_t> w = get<uint16_t>(weights_);
    for (int64_t i = 0; i < kElems; ++i) {
      const bool written = i < 1100 || (i >= 1200 && i < 2900);
      ASSERT_EQ(w[i], written ? 7 : 0) << i;
    }
  }
}

TEST_F(OptimizerWindowsTest, WhatWasReadAheadIsDroppedWhenTheStateChanges) {
  std::vector<float> v(kElems, 1.0f);
  set_state(v);
  std::vector<std::pair<int64_t, int64_t>> stepped;
  std::vector<int64_t> advanced;
  ASSERT_TRUE(pass(&stepped, &advanced).ok());  // reads the first sub-group of the next pass ahead
  // The state is rewritten (a checkpoint load, say): the read ahead is stale.
  std::vector<float> fresh(kElems, 10.0f);
  windows_->drop_read_ahead();
  set_state(fresh);
  ASSERT_TRUE(pass(&stepped, &advanced).ok());
  const std::vector<float> s = state();
  for (int64_t i = 0; i < kElems; ++i) ASSERT_EQ(s[i], 11.0f) << i;
}

}  // namespace
}  // namespace zoe
