// The optimizer's windows hashed where Adam has them in cache (sched/window_sums.h): the same
// update as adam_step, bitwise; the sums of what it wrote are the blocks' xxh3, for the fp32
// state and for the bf16 weights whose blocks hold two of the state's (the store then verifies
// them on its own reads); a block changed on disk is found by the Adam pass, naming the
// file and block; and in the engine, the path runs and trains bitwise as in memory.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include <gtest/gtest.h>

#include "comm/comm.h"
#include "cpu/cpu_device.h"
#include "engine_harness.h"
#include "nvme/block_table.h"
#include "sched/state_array.h"
#include "sched/optimizer/window_sums.h"
#include "test_util.h"

namespace zoe {
namespace {

constexpr uint32_t kBlock = 4096;  // 1024 fp32 elements a block

struct Aligned {
  explicit Aligned(size_t n) : p(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)) {}
  ~Aligned() { std::free(p); }
  template <typename T>
  T* as() { return static_cast<T*>(p); }
  void* p;
};

std::vector<float> random_floats(int64_t n, uint64_t seed, bool positive) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = positive ? std::abs(d(rng)) * 1e-3f : d(rng);
  return v;
}

class WindowSumsTest : public ::testing::Test {
 protected:
  explicit WindowSumsTest(int64_t elems = 10000) : kElems(elems) {}
  void SetUp() override {
    root_ = test::make_temp_dir("winsums");
    NvmeStoreOptions o;
    o.nvme_path = root_;
    o.job = "winsums";
    o.block_size = kBlock;
    o.ledger = &dev_.ledger();
    auto s = NvmeStore::open(o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(s).value();
    const char* names[3] = {"master", "exp_avg", "exp_avg_sq"};
    const Kind kinds[3] = {Kind::kMaster, Kind::kExpAvg, Kind::kExpAvgSq};
    for (int i = 0; i < 3; ++i) {
      Status st = arrays_[i].allocate(dev_, {Tier::kNvme, 1.0, store_.get(), names[i]}, kElems, 4, kinds[i]);
      ASSERT_TRUE(st.ok()) << st.message();
      state_[i] = random_floats(kElems, 10 + i, /*positive=*/i == 2);
      ASSERT_TRUE(arrays_[i].wait(arrays_[i].write_async(0, kElems, state_[i].data())).ok());
    }
    // The bf16 weights: the same elements, 2048 a block (each block two of the state's).
    Status st = param_.allocate(dev_, {Tier::kNvme, 1.0, store_.get(), "param"}, kElems, 2, Kind::kParam);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  void TearDown() override {
    for (StateArray& a : arrays_) a.release(dev_);
    param_.release(dev_);
    store_.reset();
    std::filesystem::remove_all(root_);
  }

  // Reads window [a, b) of each array with its sums in the caller's hands.
  Status read_window(int64_t a, int64_t b, Aligned* w[3], std::shared_ptr<BlockSums> sums[3]) {
    Status first;
    for (int i = 0; i < 3; ++i) {
      sums[i] = make_block_sums(arrays_[i], a, b, /*read=*/true);
      Status s = arrays_[i].wait(arrays_[i].read_async(a, b - a, w[i]->p, false, sums[i]));
      if (first.ok()) first = s;
    }
    return first;
  }

  void flip_byte(int array, uint64_t offset) {
    const std::string path = store_->region_path(array);
    int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, offset), 1);
    b ^= 0x20;
    ASSERT_EQ(::pwrite(fd, &b, 1, offset), 1);
    ASSERT_EQ(::fdatasync(fd), 0);
    ::close(fd);
  }

  const int64_t kElems;  // per array
  std::string root_;
  CpuDevice dev_{1 << 20, 64 << 20, /*strict=*/false};
  std::unique_ptr<NvmeStore> store_;
  StateArray arrays_[3];
  StateArray param_;
  std::vector<float> state_[3];

  void check_window(int64_t a, int64_t b);
};

// Steps window [a, b) with its sums (a and b not on block boundaries) and checks it against adam_step.
void WindowSumsTest::check_window(int64_t a, int64_t b) {
  const int64_t n = b - a;
  Aligned m0(n * 4), m1(n * 4), m2(n * 4);
  Aligned* w[3] = {&m0, &m1, &m2};
  std::shared_ptr<BlockSums> in[3];
  ASSERT_TRUE(read_window(a, b, w, in).ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(in[i]->first, static_cast<uint64_t>(a / 1024 + 1));
    ASSERT_EQ(in[i]->count(), static_cast<uint64_t>(b / 1024 - a / 1024 - 1));
    for (uint64_t k = 0; k < in[i]->count(); ++k) EXPECT_EQ(in[i]->check[k], 1);
  }
  // Three ranges with a gap (padding Adam leaves alone) and mixed decay; bf16 gradients. The
  // weights' window is write-only: zero where Adam writes nothing.
  std::vector<uint16_t> grads(n), ref_params(n, 0);
  Aligned pw(n * 2);
  uint16_t* params = pw.as<uint16_t>();
  std::memset(params, 0, n * 2);
  std::mt19937 rng(5);
  for (uint16_t& g : grads) g = static_cast<uint16_t>(0x3c00 + rng() % 0x600) ^ (rng() % 2 ? 0x8000 : 0);
  std::vector<float> ref[3];
  for (int i = 0; i < 3; ++i) ref[i].assign(w[i]->as<float>(), w[i]->as<float>() + n);
  struct Span {
    int64_t e, n;
    bool decay;
  } spans[] = {{700, 2300, true}, {3000, 1, false}, {3050, b - 3050, true}};
  AdamHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  h.step = 3;
  std::vector<IndexedAdamRange> ranges;
  for (const Span& s : spans) {
    auto range = [&](float* const* arr, uint16_t* out) {
      AdamRange r;
      r.grad = grads.data() + (s.e - a);
      r.grad_dtype = DType::kBF16;
      r.master = arr[0] + (s.e - a);
      r.exp_avg = arr[1] + (s.e - a);
      r.exp_avg_sq = arr[2] + (s.e - a);
      r.param_out = out + (s.e - a);
      r.param_dtype = DType::kBF16;
      r.n = s.n;
      r.decay = s.decay;
      return r;
    };
    float* win[3] = {m0.as<float>(), m1.as<float>(), m2.as<float>()};
    float* refs[3] = {ref[0].data(), ref[1].data(), ref[2].data()};
    ranges.push_back({s.e, range(win, params)});
    adam_step(h, range(refs, ref_params.data()), best_isa());
  }
  auto out = [&](int i) { return make_block_sums(arrays_[i], a, b, /*read=*/false); };
  std::vector<HashedArray> hashed;
  for (int i = 0; i < 3; ++i) hashed.push_back({&arrays_[i], w[i]->as<char>(), in[i], out(i)});
  hashed.push_back({&param_, pw.as<char>(), nullptr, make_block_sums(param_, a, b, /*read=*/false)});
  auto bad = adam_with_block_sums(h, ranges, a, b, hashed);
  ASSERT_TRUE(bad.ok()) << bad.status().message();
  EXPECT_EQ(bad.value(), 0u);
  std::printf("[ adam isa ] %s\n", isa_name(best_isa()));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(0, std::memcmp(w[i]->p, ref[i].data(), n * 4)) << "array " << i;
    const BlockSums& s = *hashed[i].out;
    for (uint64_t k = 0; k < s.count(); ++k)
      EXPECT_EQ(s.sums[k], BlockTable::hash(w[i]->as<char>() + ((s.first + k) * 1024 - a) * 4, kBlock)) << k;
  }
  EXPECT_EQ(0, std::memcmp(params, ref_params.data(), n * 2));
  const BlockSums& ps = *hashed[3].out;
  ASSERT_EQ(ps.first, static_cast<uint64_t>(a / 2048 + 1));
  ASSERT_EQ(ps.count(), static_cast<uint64_t>(b / 2048 - a / 2048 - 1));
  for (uint64_t k = 0; k < ps.count(); ++k)
    EXPECT_EQ(ps.sums[k], BlockTable::hash(pw.as<char>() + ((ps.first + k) * 2048 - a) * 2, kBlock)) << k;

  // Written back with those sums, the store's own reads verify against them.
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(arrays_[i].wait(arrays_[i].write_async(a, n, w[i]->p, false, hashed[i].out)).ok());
  ASSERT_TRUE(param_.wait(param_.write_async(a, n, params, false, hashed[3].out)).ok());
  std::vector<float> all(kElems);
  for (int i = 0; i < 3; ++i) {
    Status s = arrays_[i].wait(arrays_[i].read_async(0, kElems, all.data()));
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(0, std::memcmp(all.data() + a, ref[i].data(), n * 4));
  }
  std::vector<uint16_t> all_params(kElems);
  Status s = param_.wait(param_.read_async(0, kElems, all_params.data()));
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(0, std::memcmp(all_params.data() + a, ref_params.data(), n * 2));
}

// Window [700, 9300): blocks 1..8 whole (elements 1024..9215), 0 and 9 in part; one thread.
TEST_F(WindowSumsTest, AdamIsBitwiseAdamStepAndItsSumsAreTheBlocks) { check_window(700, 9300); }

// A window of 280 blocks: its cells run on oneTBB's threads (not in the TSan pass: oneTBB's own
// hand-offs are not instrumented there).
class WindowSumsParallel : public WindowSumsTest {
 protected:
  WindowSumsParallel() : WindowSumsTest(300000) {}
};
TEST_F(WindowSumsParallel, AdamIsBitwiseAdamStepAndItsSumsAreTheBlocks) { check_window(700, 287300); }

TEST_F(WindowSumsTest, ABlockChangedOnDiskIsFoundByTheAdamPass) {
  const int64_t a = 700, b = 9300, n = b - a;
  Aligned m0(n * 4), m1(n * 4), m2(n * 4);
  Aligned* w[3] = {&m0, &m1, &m2};
  std::vector<uint16_t> grads(n, 0x3c00), params(n);
  auto run = [&](std::shared_ptr<BlockSums> in[3]) {
    AdamRange r;
    r.grad = grads.data();
    r.grad_dtype = DType::kBF16;
    r.master = m0.as<float>();
    r.exp_avg = m1.as<float>();
    r.exp_avg_sq = m2.as<float>();
    r.param_out = params.data();
    r.n = n;
    std::vector<IndexedAdamRange> ranges = {{a, r}};
    std::vector<HashedArray> hashed;
    for (int i = 0; i < 3; ++i)
      hashed.push_back({&arrays_[i], w[i]->as<char>(), in[i], make_block_sums(arrays_[i], a, b, false)});
    return adam_with_block_sums(AdamHyper{}, ranges, a, b, hashed).status();
  };
  // Block 4 of exp_avg (whole in the window): the store hands it over, the Adam pass finds it.
  flip_byte(1, 4 * kBlock + 123);
  std::shared_ptr<BlockSums> in[3];
  ASSERT_TRUE(read_window(a, b, w, in).ok());
  Status s = run(in);
  ASSERT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find(store_->region_path(1) + ": checksum mismatch in block 4 (bytes 16384..20479)"),
            std::string::npos)
      << s.message();
  // Block 9 of master (the window's partial end) stays the store's to check, on the read.
  flip_byte(0, 9 * kBlock + 5);
  s = read_window(a, b, w, in);
  ASSERT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find(store_->region_path(0) + ": checksum mismatch in block 9 "), std::string::npos)
      << s.message();
}

// In the engine: optimizer state and parameters on NVMe, sub-groups large enough to cover whole
// blocks, trains to bitwise the in-memory weights with the host Adam making the state's sums;
// with zoe.checksums off nothing is hashed.
TEST(WindowSumsEngine, StateOnNvmeHashedByAdamTrainsBitwiseAsInMemory) {
  auto self = make_self_comm();
  const std::string dir = test::make_temp_dir("winsums-engine");
  Config c = test::mlp_config(3, DType::kBF16, 3, 64);  // 4161 elements a unit: four 1 KiB-element blocks
  auto mem = test::run_mlp(test::scheduler_off(c), *self, 3);
  ASSERT_TRUE(mem.ok()) << mem.status().message();
  for (bool checksums : {true, false}) {
    SCOPED_TRACE(checksums);
    Config n = test::with_nvme_offload(c, dir, 1.0);
    n.sub_group_size = 1 << 20;
    n.checksums = checksums;
    auto nv = test::run_mlp(n, *self, 3);
    ASSERT_TRUE(nv.ok()) << nv.status().message();
    EXPECT_EQ(nv->params, mem->params);
    if (checksums)
      EXPECT_GT(nv->sched.adam_hashed_blocks, 0);
    else
      EXPECT_EQ(nv->sched.adam_hashed_blocks, 0);
    std::printf("[ checksums %s ] blocks hashed by Adam: %lld\n", checksums ? "on" : "off",
                static_cast<long long>(nv->sched.adam_hashed_blocks));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zoe
