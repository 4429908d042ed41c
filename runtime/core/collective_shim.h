// TEMPORARY: until the registry's op traits land (ops::Collective).
#pragma once
#include <string_view>
namespace strata::ops {
enum class Collective : uint8_t {
  kNone,
  kCopy,
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSplit
};
constexpr bool sums(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter;
}
inline Collective collective_of(std::string_view op) {
  if (op == "TpCopy") return Collective::kCopy;
  if (op == "TpAllReduce") return Collective::kAllReduce;
  if (op == "TpAllGather") return Collective::kAllGather;
  if (op == "TpReduceScatter") return Collective::kReduceScatter;
  if (op == "TpAllToAll") return Collective::kAllToAll;
  if (op == "TpSplit") return Collective::kSplit;
  return Collective::kNone;
}
} // namespace strata::ops
