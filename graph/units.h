// Human-readable quantities for messages and reports.
#pragma once

#include <string>

namespace strata {

// "466.4K", "1.23M" (counts, powers of 1000); "2.50 GFLOP"; "1.00 MiB", "3.64 TiB",
// "1.00 PiB" (bytes, powers of 1024). Two decimals below 100, one above.
std::string human_count(double value);
std::string human_flops(double flops);
std::string human_bytes(double bytes);

} // namespace strata
