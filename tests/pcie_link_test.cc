// `zoe bench gpu`'s baselines from what the machine says of itself: a PCIe link's rated rate from
// the text sysfs gives for it, a GPU's dense bf16 rate from the name its driver reports.
#include <gtest/gtest.h>

#include "gpu_bench.h"

namespace zoe {
namespace {

TEST(PcieLink, RatedRateFromSysfsText) {
  // Gen 5 x16 (an H200's host link): 32 GT/s x 16 lanes x 128/130 / 8 bits = 63.0 GB/s.
  EXPECT_NEAR(pcie_rated_gbps("32.0 GT/s PCIe", "16"), 63.015, 1e-3);
  EXPECT_NEAR(pcie_rated_gbps("16.0 GT/s PCIe", "16"), 31.508, 1e-3);  // Gen 4
  EXPECT_NEAR(pcie_rated_gbps("8.0 GT/s PCIe", "8"), 7.877, 1e-3);     // Gen 3 x8
  EXPECT_NEAR(pcie_rated_gbps("5.0 GT/s PCIe", "4"), 2.0, 1e-9);       // Gen 2: 8b/10b
  // What a VM without the link shows, or no file at all: no baseline.
  EXPECT_EQ(pcie_rated_gbps("", ""), 0);
  EXPECT_EQ(pcie_rated_gbps("Unknown", "16"), 0);
  EXPECT_EQ(pcie_rated_gbps("32.0 GT/s PCIe", "0"), 0);
  EXPECT_EQ(pcie_rated_gbps("32.0 GT/s PCIe", "x"), 0);
}

TEST(GpuRatedBf16, DenseRateByTheDriversName) {
  EXPECT_EQ(rated_bf16_tflops("NVIDIA H200"), 989.4);
  EXPECT_EQ(rated_bf16_tflops("NVIDIA H200 NVL"), 835.5);  // the longer name first
  EXPECT_EQ(rated_bf16_tflops("NVIDIA H100 80GB HBM3"), 989.4);
  EXPECT_EQ(rated_bf16_tflops("NVIDIA H100 PCIe"), 756.5);
  EXPECT_EQ(rated_bf16_tflops("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_EQ(rated_bf16_tflops("NVIDIA GeForce RTX 4090"), 0);  // not listed: no rate
  EXPECT_EQ(rated_bf16_tflops(""), 0);
}

}  // namespace
}  // namespace zoe
