// Synthetic tabular data for the trainer's tests: three well-separated classes in two informative features, plus a
// large-offset feature (exercises standardisation) and a noise feature. Deterministic for a seed.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>

namespace parsyn::trainer::testing {

// CSV text with header "x0,x1,offset,noise,label" and labels "north", "south_east", "south_west".
inline std::string SeparableCsv(int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, 0.4);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  const char* names[] = {"north", "south_east", "south_west"};
  std::ostringstream out;
  out << "x0,x1,offset,noise,label\n";
  for (int64_t i = 0; i < rows; ++i) {
    const int k = static_cast<int>(i % 3);
    const double angle = 1.5707963 + 2.0943951 * k;  // 90, 210, 330 degrees
    out << 3 * std::cos(angle) + noise(rng) << "," << 3 * std::sin(angle) + noise(rng) << ","
        << 1000 + 50 * uniform(rng) << "," << uniform(rng) << "," << names[k] << "\n";
  }
  return out.str();
}

}  // namespace parsyn::trainer::testing
