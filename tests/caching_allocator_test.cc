// The CUDA device's caching allocator over a fake raw allocator (plain host memory), so every
// rule runs on the CPU: reuse without raw calls, splitting and coalescing, the pools' segment
// sizes, the budget (with the cache released before failing), raw failures, the error text and
// the ledger, which sees what was asked for and never the cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "gpu/caching_allocator.h"

namespace zoe::gpu {
namespace {

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;

// Host memory standing in for cudaMalloc/cudaFree, with a physical capacity (the GPU's memory)
// and a record of every call.
struct FakeRaw {
  size_t capacity = std::numeric_limits<size_t>::max();
  size_t used = 0;
  std::map<void*, size_t> live;
  std::vector<size_t> malloc_sizes;
  int frees = 0;
  int bad_frees = 0;

  RawMemory fns() {
    return RawMemory{[this](size_t n) -> Result<void*> {
                       malloc_sizes.push_back(n);
                       if (n > capacity - used) return Status::OutOfMemory("fake: out of memory");
                       void* p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
                       if (!p) return Status::OutOfMemory("fake: host aligned_alloc failed");
                       live[p] = n;
                       used += n;
                       return p;
                     },
                     [this](void* p) {
                       auto it = live.find(p);
                       if (it == live.end()) {
                         ++bad_frees;
                         return;
                       }
                       used -= it->second;
                       live.erase(it);
                       std::free(p);
                       ++frees;
                     }};
  }
};

uint64_t booked(const Ledger& l, Tier t, Kind k) {
  return l.snapshot().bytes[static_cast<int>(t)][static_cast<int>(k)];
}

uintptr_t addr(void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(CachingAllocator, ReusesAFreedBlockWithoutRawCalls) {
  FakeRaw raw;
  CachingAllocator a(size_t{1} << 30, raw.fns());
  auto p = a.allocate(1000, Kind::kParam);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(raw.malloc_sizes.size(), 1u);
  EXPECT_EQ(raw.malloc_sizes[0], CachingAllocator::kSmallSegment);  // small requests: 2 MiB segments
  EXPECT_TRUE(a.release(p.value()));
  auto q = a.allocate(1000, Kind::kGrad);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q.value(), p.value());
  EXPECT_EQ(raw.malloc_sizes.size(), 1u);
  EXPECT_EQ(raw.frees, 0);
  CachingAllocator::Stats s = a.stats();
  EXPECT_EQ(s.raw_mallocs, 1u);
  EXPECT_EQ(s.raw_frees, 0u);
  EXPECT_EQ(s.in_use, 1024u);  // rounded to 512 bytes
  EXPECT_EQ(s.requested, 1000u);
  EXPECT_EQ(s.reserved, CachingAllocator::kSmallSegment);
  EXPECT_EQ(s.cached, CachingAllocator::kSmallSegment - 1024);
  EXPECT_TRUE(a.release(q.value()));
}

TEST(CachingAllocator, SmallRequestsShareASegmentAlignedAndDisjoint) {
  FakeRaw raw;
  CachingAllocator a(size_t{1} << 30, raw.fns());
  std::vector<std::pair<uintptr_t, size_t>> blocks;
  const size_t sizes[] = {1, 511, 512, 513, 4000, 100 * KiB, 3};
  for (size_t n : sizes) {
    auto p = a.allocate(n, Kind::kActivation);
    ASSERT_TRUE(p.ok());
    blocks.emplace_back(addr(p.value()), n);
  }
  EXPECT_EQ(raw.malloc_sizes.size(), 1u);
  const uintptr_t base = addr(raw.live.begin()->first);
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ((blocks[i].first - base) % CachingAllocator::kAlign, 0u);
    EXPECT_GE(blocks[i].first, base);
    EXPECT_LE(blocks[i].first + blocks[i].second, base + CachingAllocator::kSmallSegment);
    if (i + 1 < blocks.size()) {
      EXPECT_LE(blocks[i].first + blocks[i].second, blocks[i + 1].first);
    }
  }
}

TEST(CachingAllocator, ZeroBytesGetsADistinctBlock) {
  FakeRaw raw;
  CachingAllocator a(size_t{1} << 30, raw.fns());
  auto p = a.allocate(0, Kind::kStaging);
  auto q = a.allocate(0, Kind::kStaging);
  ASSERT_TRUE(p.ok() && q.ok());
  EXPECT_NE(p.value(), nullptr);
  EXPECT_NE(p.value(), q.value());
  EXPECT_EQ(a.stats().requested, 0u);
  EXPECT_EQ(a.stats().in_use, 2 * CachingAllocator::kAlign);
  EXPECT_TRUE(a.release(p.value()));
  EXPECT_TRUE(a.release(q.value()));
}

TEST(CachingAllocator, SegmentSizesPerPool) {
  FakeRaw raw;
  CachingAllocator a(size_t{1} << 30, raw.fns());
  ASSERT_TRUE(a.allocate(MiB, Kind::kParam).ok());          // small: the largest small request
  ASSERT_TRUE(a.allocate(MiB + 1, Kind::kParam).ok());      // medium: a 20 MiB segment
  ASSERT_TRUE(a.allocate(33 * MiB + 1, Kind::kParam).ok()); // large: its own size rounded to 2 MiB
  ASSERT_EQ(raw.malloc_sizes.size(), 3u);
  EXPECT_EQ(raw.malloc_sizes[0], 2 * MiB);
  EXPECT_EQ(raw.malloc_sizes[1], 20 * MiB);
  EXPECT_EQ(raw.malloc_sizes[2], 34 * MiB);
  EXPECT_EQ(a.stats().reserved, 56 * MiB);
}

TEST(CachingAllocator, SplitsAndCoalesces) {
  FakeRaw raw;
  CachingAllocator a(size_t{1} << 30, raw.fns());
  auto x = a.allocate(4 * MiB, Kind::kParam);
  auto y = a.allocate(4 * MiB, Kind::kParam);
  auto z = a.allocate(4 * MiB, Kind::kParam);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  ASSERT_EQ(raw.malloc_sizes.size(), 1u);  // one 20 MiB segment, split three times
  EXPECT_EQ(addr(y.value()), addr(x.value()) + 4 * MiB);
  EXPECT_EQ(addr(z.value()), addr(x.value()) + 8 * MiB);

  // Freeing y then x leaves one 8 MiB block at x (merged backwards and forwards); the segment's
  // tail is another 8 MiB block. Best fit with the lowest address takes x's.
  ASSERT_TRUE(a.release(y.value()));
  ASSERT_TRUE(a.release(x.value()));
  auto w = a.allocate(8 * MiB, Kind::kGrad);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w.value(), x.value());
  // A smaller request takes the smallest block that fits: here the tail (8 MiB), split.
  auto v = a.allocate(6 * MiB, Kind::kGrad);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(addr(v.value()), addr(x.value()) + 12 * MiB);
  EXPECT_EQ(raw.malloc_sizes.size(), 1u);

  // Everything back: the segment is one free block again, which serves a request of its whole
  // size, and release_cached returns it.
  ASSERT_TRUE(a.release(w.value()));
  ASSERT_TRUE(a.release(z.value()));
  ASSERT_TRUE(a.release(v.value()));
  auto whole = a.allocate(20 * MiB, Kind::kMaster);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole.value(), x.value());
  EXPECT_EQ(raw.malloc_sizes.size(), 1u);
  ASSERT_TRUE(a.release(whole.value()));
  a.release_cached();
  EXPECT_EQ(raw.frees, 1);
  EXPECT_TRUE(raw.live.empty());
  EXPECT_EQ(a.stats().reserved, 0u);
  EXPECT_EQ(a.stats().segments, 0u);
}

TEST(CachingAllocator, SmallRemaindersOfLargeBlocksAreNotSplit) {
  FakeRaw raw;
  CachingAllocator a(size_t{1} << 30, raw.fns());
  auto x = a.allocate(19 * MiB + 512 * KiB, Kind::kParam);  // 20 MiB segment, 512 KiB left: kept whole
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(a.stats().in_use, 20 * MiB);
  EXPECT_EQ(a.stats().requested, 19 * MiB + 512 * KiB);
  auto y = a.allocate(2 * MiB, Kind::kParam);  // cannot come from x's segment
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(raw.malloc_sizes.size(), 2u);
}

TEST(CachingAllocator, SmallAndLargePoolsDoNotMix) {
  FakeRaw raw;
  CachingAllocator a(size_t{1} << 30, raw.fns());
  auto big = a.allocate(4 * MiB, Kind::kParam);
  ASSERT_TRUE(big.ok());
  ASSERT_TRUE(a.release(big.value()));  // 20 MiB free in the large pool
  auto small = a.allocate(4 * KiB, Kind::kParam);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(raw.malloc_sizes.size(), 2u);  // a small segment, not a split of the large block
  EXPECT_EQ(raw.malloc_sizes[1], 2 * MiB);
}

TEST(CachingAllocator, BudgetCapsReservationAndNamesTheKey) {
  FakeRaw raw;
  Ledger ledger;
  CachingAllocator a(8 * MiB, raw.fns(), &ledger);
  auto x = a.allocate(5 * MiB, Kind::kParam);  // 20 MiB segment over budget: a 5 MiB one instead
  ASSERT_TRUE(x.ok()) << x.status().message();
  ASSERT_EQ(raw.malloc_sizes.size(), 1u);
  EXPECT_EQ(raw.malloc_sizes[0], 5 * MiB);
  auto y = a.allocate(4 * MiB, Kind::kGrad);
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), Code::kOutOfMemory);
  const std::string& m = y.status().message();
  EXPECT_NE(m.find("device memory budget exhausted"), std::string::npos) << m;
  EXPECT_NE(m.find("asked for 4194304 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("5242880 bytes in use in 1 blocks"), std::string::npos) << m;
  EXPECT_NE(m.find("0 bytes cached"), std::string::npos) << m;
  EXPECT_NE(m.find("budget 8388608 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("zoe.device_memory_budget"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_EQ(raw.malloc_sizes.size(), 1u);  // nothing asked of the raw allocator beyond the budget
  EXPECT_EQ(booked(ledger, Tier::kDevice, Kind::kGrad), 0u);  // a failure books nothing
  EXPECT_EQ(booked(ledger, Tier::kDevice, Kind::kParam), 5 * MiB);
  // Exactly up to the budget is fine.
  auto z = a.allocate(3 * MiB, Kind::kGrad);
  ASSERT_TRUE(z.ok()) << z.status().message();
  EXPECT_EQ(a.stats().reserved, 8 * MiB);
}

TEST(CachingAllocator, ReleasesTheCacheBeforeFailing) {
  FakeRaw raw;
  CachingAllocator a(8 * MiB, raw.fns());
  auto s = a.allocate(100 * KiB, Kind::kStaging);  // a 2 MiB small segment
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(a.release(s.value()));
  EXPECT_EQ(a.stats().cached, 2 * MiB);
  auto big = a.allocate(7 * MiB, Kind::kParam);  // 2 + 7 > 8: the cached segment must go first
  ASSERT_TRUE(big.ok()) << big.status().message();
  EXPECT_EQ(raw.frees, 1);
  EXPECT_EQ(a.stats().reserved, 7 * MiB);
  EXPECT_EQ(a.stats().segments, 1u);
}

TEST(CachingAllocator, FragmentedCacheIsReportedWhenItCannotServe) {
  FakeRaw raw;
  CachingAllocator a(20 * MiB, raw.fns());
  auto x = a.allocate(4 * MiB, Kind::kParam);
  auto y = a.allocate(4 * MiB, Kind::kParam);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(a.release(x.value()));  // the segment holds y: nothing can be released
  auto z = a.allocate(14 * MiB, Kind::kParam);
  ASSERT_FALSE(z.ok());
  EXPECT_EQ(z.status().code(), Code::kOutOfMemory);
  const std::string& m = z.status().message();
  EXPECT_NE(m.find("asked for 14680064 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("4194304 bytes in use in 1 blocks"), std::string::npos) << m;
  EXPECT_NE(m.find("16777216 bytes cached"), std::string::npos) << m;
  EXPECT_NE(m.find("largest free block 12582912"), std::string::npos) << m;
  EXPECT_EQ(raw.frees, 0);
  // What fits in the cache still comes from it.
  auto w = a.allocate(12 * MiB, Kind::kParam);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(raw.malloc_sizes.size(), 1u);
}

// Under a budget smaller than a segment every block is a segment of its own size. Such a block is
// reused whole, never split: a piece left in it would strand budget that no release can return
// (found by the engine's quarter-budget test on the emulated GPU: a reduction buffer failed with
// its bytes scattered over pieces of gather buffers' segments).
TEST(CachingAllocator, ASegmentCutToARequestIsReusedWholeNeverSplit) {
  FakeRaw raw;
  CachingAllocator a(40 * KiB, raw.fns());
  auto big = a.allocate(16 * KiB, Kind::kComm);  // a 2 MiB segment is over budget: 16 KiB of its own
  ASSERT_TRUE(big.ok()) << big.status().message();
  EXPECT_EQ(raw.malloc_sizes.back(), 16 * KiB);
  ASSERT_TRUE(a.release(big.value()));
  auto small = a.allocate(8 * KiB, Kind::kGather);  // takes the cached block whole
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small.value(), big.value());
  EXPECT_EQ(a.stats().in_use, 16 * KiB) << "the block was split";
  // The rest of the budget is 24 KiB: a second 16 KiB request gets a segment of its own, and a
  // third, after the first block is back, the idle segment (released, not stranded in pieces).
  auto second = a.allocate(16 * KiB, Kind::kComm);
  ASSERT_TRUE(second.ok()) << second.status().message();
  ASSERT_TRUE(a.release(small.value()));
  auto third = a.allocate(20 * KiB, Kind::kComm);
  ASSERT_TRUE(third.ok()) << third.status().message();
  EXPECT_EQ(a.stats().segments, 2u);
}

TEST(CachingAllocator, RawFailureReleasesTheCacheAndRetries) {
  FakeRaw raw;
  raw.capacity = 4 * MiB;  // the "GPU" is smaller than the budget
  CachingAllocator a(size_t{1} << 30, raw.fns());
  auto s = a.allocate(KiB, Kind::kStaging);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(a.release(s.value()));
  auto x = a.allocate(3 * MiB, Kind::kParam);  // 20 MiB fails, 3 MiB fails (2 cached), cache goes, 3 MiB
  ASSERT_TRUE(x.ok()) << x.status().message();
  EXPECT_EQ(raw.frees, 1);
  ASSERT_EQ(raw.malloc_sizes.size(), 5u);
  EXPECT_EQ(raw.malloc_sizes[1], 20 * MiB);
  EXPECT_EQ(raw.malloc_sizes[2], 3 * MiB);
  EXPECT_EQ(raw.malloc_sizes[3], 20 * MiB);
  EXPECT_EQ(raw.malloc_sizes[4], 3 * MiB);
}

TEST(CachingAllocator, RawFailureIsReportedWithItsReason) {
  FakeRaw raw;
  raw.capacity = MiB;
  CachingAllocator a(size_t{1} << 30, raw.fns(), nullptr, Tier::kDevice, "device memory",
                     "zoe.device_memory_budget");
  auto x = a.allocate(3 * MiB, Kind::kParam);
  ASSERT_FALSE(x.ok());
  EXPECT_EQ(x.status().code(), Code::kOutOfMemory);
  const std::string& m = x.status().message();
  EXPECT_NE(m.find("device memory allocation of 3145728 bytes failed: fake: out of memory"), std::string::npos) << m;
  EXPECT_NE(m.find("zoe.device_memory_budget"), std::string::npos) << m;
  EXPECT_EQ(a.stats().reserved, 0u);
  EXPECT_TRUE(raw.live.empty());
}

TEST(CachingAllocator, ErrorNamesTheMemoryAndKeyItWasGiven) {
  FakeRaw raw;
  CachingAllocator a(MiB, raw.fns(), nullptr, Tier::kHost, "pinned host memory", "zoe.host_memory_budget");
  auto x = a.allocate(2 * MiB, Kind::kStaging);
  ASSERT_FALSE(x.ok());
  EXPECT_NE(x.status().message().find("pinned host memory budget exhausted"), std::string::npos);
  EXPECT_NE(x.status().message().find("raise zoe.host_memory_budget"), std::string::npos);
}

TEST(CachingAllocator, AbsurdRequestFailsCleanly) {
  FakeRaw raw;
  CachingAllocator a(size_t{1} << 30, raw.fns());
  auto x = a.allocate(std::numeric_limits<size_t>::max() - 5, Kind::kParam);
  ASSERT_FALSE(x.ok());
  EXPECT_EQ(x.status().code(), Code::kOutOfMemory);
  auto y = a.allocate(size_t{1} << 40, Kind::kParam);
  ASSERT_FALSE(y.ok());
  EXPECT_TRUE(raw.malloc_sizes.empty());
}

TEST(CachingAllocator, LedgerSeesRequestsNeverTheCache) {
  FakeRaw raw;
  Ledger ledger;
  CachingAllocator a(size_t{1} << 30, raw.fns(), &ledger, Tier::kDevice);
  auto p = a.allocate(1000, Kind::kParam);
  auto g = a.allocate(3 * MiB, Kind::kGrad);
  ASSERT_TRUE(p.ok() && g.ok());
  EXPECT_EQ(booked(ledger, Tier::kDevice, Kind::kParam), 1000u);
  EXPECT_EQ(booked(ledger, Tier::kDevice, Kind::kGrad), 3 * MiB);
  EXPECT_EQ(ledger.snapshot().peak[0], 1000 + 3 * MiB);
  EXPECT_EQ(booked(ledger, Tier::kHost, Kind::kParam), 0u);
  ASSERT_TRUE(a.release(g.value()));
  EXPECT_EQ(booked(ledger, Tier::kDevice, Kind::kGrad), 0u);  // back in the cache, out of the ledger
  EXPECT_GT(a.stats().cached, 0u);
  // A cached block handed out again is booked under its new kind and size.
  auto c = a.allocate(2 * MiB, Kind::kComm);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c.value(), g.value());
  EXPECT_EQ(booked(ledger, Tier::kDevice, Kind::kComm), 2 * MiB);
  EXPECT_EQ(booked(ledger, Tier::kDevice, Kind::kGrad), 0u);
  // Unknown pointers and double releases change nothing.
  int local = 0;
  EXPECT_FALSE(a.release(&local));
  EXPECT_FALSE(a.release(nullptr));
  ASSERT_TRUE(a.release(c.value()));
  EXPECT_FALSE(a.release(c.value()));
  EXPECT_EQ(booked(ledger, Tier::kDevice, Kind::kComm), 0u);
  a.release_cached();  // returning segments books nothing either
  EXPECT_EQ(booked(ledger, Tier::kDevice, Kind::kParam), 1000u);
  ASSERT_TRUE(a.release(p.value()));
  LedgerSnapshot s = ledger.snapshot();
  for (int k = 0; k < kNumKinds; ++k) EXPECT_EQ(s.bytes[0][k], 0u) << "kind " << k;
  EXPECT_EQ(s.peak[0], 1000 + 3 * MiB);
  EXPECT_EQ(raw.bad_frees, 0);
}

TEST(CachingAllocator, DestructorReturnsEverySegment) {
  FakeRaw raw;
  {
    CachingAllocator a(size_t{1} << 30, raw.fns());
    ASSERT_TRUE(a.allocate(10, Kind::kParam).ok());
    ASSERT_TRUE(a.allocate(5 * MiB, Kind::kParam).ok());
    auto x = a.allocate(30 * MiB, Kind::kParam);
    ASSERT_TRUE(x.ok());
    ASSERT_TRUE(a.release(x.value()));
    EXPECT_EQ(raw.live.size(), 3u);
  }
  EXPECT_TRUE(raw.live.empty());
  EXPECT_EQ(raw.frees, 3);
  EXPECT_EQ(raw.bad_frees, 0);
}

// Random allocations and releases over all pools: blocks never overlap (each is filled with its
// own byte and checked before release), the stats add up, and once everything is released every
// segment has coalesced back into one block that release_cached returns.
TEST(CachingAllocator, RandomWorkloadKeepsBlocksDisjointAndCoalescesFully) {
  FakeRaw raw;
  Ledger ledger;
  CachingAllocator a(256 * MiB, raw.fns(), &ledger);
  std::mt19937_64 rng(7);
  struct Live {
    unsigned char* p;
    size_t n;
    unsigned char tag;
  };
  std::vector<Live> live;
  size_t requested = 0;
  auto check_and_release = [&](size_t i) {
    Live l = live[i];
    for (size_t k = 0; k < l.n; k += 97) ASSERT_EQ(l.p[k], l.tag) << "block overwritten";
    if (l.n) {
      ASSERT_EQ(l.p[l.n - 1], l.tag);
    }
    ASSERT_TRUE(a.release(l.p));
    requested -= l.n;
    live[i] = live.back();
    live.pop_back();
  };
  for (int iter = 0; iter < 3000; ++iter) {
    const bool alloc = live.empty() || rng() % 100 < 55;
    if (alloc) {
      size_t n;
      switch (rng() % 4) {
        case 0: n = rng() % 2048; break;
        case 1: n = rng() % MiB; break;
        case 2: n = MiB + rng() % (9 * MiB); break;
        default: n = rng() % (24 * MiB); break;
      }
      auto p = a.allocate(n, Kind::kActivation);
      if (!p.ok()) {  // only the budget may refuse
        ASSERT_EQ(p.status().code(), Code::kOutOfMemory) << p.status().message();
        continue;
      }
      const unsigned char tag = static_cast<unsigned char>(1 + rng() % 254);
      auto* q = static_cast<unsigned char*>(p.value());
      for (size_t k = 0; k < n; k += 97) q[k] = tag;
      if (n) q[n - 1] = tag;
      live.push_back({q, n, tag});
      requested += n;
    } else {
      check_and_release(rng() % live.size());
    }
    if (HasFatalFailure()) return;
    CachingAllocator::Stats s = a.stats();
    ASSERT_EQ(s.requested, requested);
    ASSERT_EQ(booked(ledger, Tier::kDevice, Kind::kActivation), requested);
    ASSERT_GE(s.in_use, s.requested);
    ASSERT_EQ(s.reserved, s.in_use + s.cached);
    ASSERT_LE(s.reserved, s.budget);
    ASSERT_EQ(s.reserved, raw.used);
    ASSERT_EQ(s.blocks_in_use, live.size());
  }
  while (!live.empty()) {
    check_and_release(live.size() - 1);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(a.stats().in_use, 0u);
  a.release_cached();
  EXPECT_EQ(a.stats().reserved, 0u);
  EXPECT_EQ(a.stats().segments, 0u);
  EXPECT_TRUE(raw.live.empty());
  EXPECT_EQ(raw.bad_frees, 0);
}

TEST(CachingAllocator, ConcurrentUseIsSafe) {
  FakeRaw raw;
  CachingAllocator a(size_t{1} << 30, raw.fns());
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<void*> mine;
      for (int i = 0; i < 2000; ++i) {
        if (mine.empty() || rng() % 2) {
          auto p = a.allocate(rng() % (3 * MiB), Kind::kStaging);
          if (!p.ok()) ++failures[t]; else mine.push_back(p.value());
        } else {
          if (!a.release(mine.back())) ++failures[t];
          mine.pop_back();
        }
      }
      for (void* p : mine)
        if (!a.release(p)) ++failures[t];
    });
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
  EXPECT_EQ(a.stats().in_use, 0u);
  EXPECT_EQ(a.stats().blocks_in_use, 0u);
}

}  // namespace
}  // namespace zoe::gpu
