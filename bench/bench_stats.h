// Statistics the benchmarks share. Machines here are noisy: figures are medians, and a ratio is
// the median over repetitions of two figures measured back to back, so drift cancels.
#pragma once
#include <algorithm>
#include <vector>

namespace zoe {

// The median (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The median over repetitions i of num[i] / den[i] (repetitions with den 0 are left out).
inline double paired_ratio(const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> r;
  for (size_t i = 0; i < num.size() && i < den.size(); ++i)
    if (den[i] > 0) r.push_back(num[i] / den[i]);
  return median(r);
}

}  // namespace zoe
