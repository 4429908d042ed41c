#include "graph/units.h"

#include <cmath>
#include <cstdio>

namespace strata {
namespace {

std::string scaled(double value, const char *const *units, int num_units, double step,
                   const char *separator) {
  int unit = 0;
  double v = value;
  while (std::fabs(v) >= step && unit + 1 < num_units) {
    v /= step;
    ++unit;
  }
  char buf[64];
  if (unit == 0 && v == std::floor(v))
    std::snprintf(buf, sizeof buf, "%.0f%s%s", v, separator, units[0]);
  else
    std::snprintf(buf, sizeof buf, "%.*f%s%s", std::fabs(v) >= 100 ? 1 : 2, v, separator,
                  units[unit]);
  return buf;
}

} // namespace

std::string human_count(double value) {
  static const char *const kUnits[] = {"", "K", "M", "B", "T"};
  return scaled(value, kUnits, 5, 1000.0, "");
}

std::string human_flops(double flops) {
  static const char *const kUnits[] = {"FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"};
  return scaled(flops, kUnits, 6, 1000.0, " ");
}

std::string human_bytes(double bytes) {
  static const char *const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  return scaled(bytes, kUnits, 6, 1024.0, " ");
}

} // namespace strata
