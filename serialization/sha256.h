// SHA-256 (FIPS 180-4), for plan fingerprints and checkpoint checksums.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include <llvm/ADT/ArrayRef.h>

namespace strata::serialization {

class Sha256 {
public:
  Sha256();
  void update(const void *data, size_t size);
  void update(llvm::ArrayRef<uint8_t> bytes) { update(bytes.data(), bytes.size()); }
  void update(std::string_view text) { update(text.data(), text.size()); }
  // The digest; the object must not be updated afterwards.
  std::array<uint8_t, 32> finish();
  // The digest as 64 lowercase hex digits.
  std::string hex_digest();

private:
  void block(const uint8_t *p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t length_ = 0; // bytes hashed so far
};

// Hex SHA-256 of bytes or text.
std::string sha256_hex(llvm::ArrayRef<uint8_t> bytes);
std::string sha256_hex(std::string_view text);

} // namespace strata::serialization
