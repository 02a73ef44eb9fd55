// SHA-256 (FIPS 180-4), self-contained: used for content-addressed cache keys.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace cuda_agent {

// Incremental SHA-256. Feed bytes with update(), read the digest with hex_digest().
// Owns its state by value; copyable. Not thread-safe: one object must not be used from
// several threads at once without external locking. Never throws except std::bad_alloc.
class Sha256 {
 public:
  Sha256();

  // Appends `data` to the message.
  void update(std::string_view data);

  // Returns the digest of everything fed so far, as 64 lowercase hex digits. Does not
  // change the state: more data may be appended afterwards, and the digest asked again.
  std::string hex_digest() const;

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;         // bytes waiting in buffer_, always < 64
  uint64_t total_bytes_ = 0;    // message length so far
};

// SHA-256 of `data` as 64 lowercase hex digits. Thread-safe.
std::string sha256_hex(std::string_view data);

}  // namespace cuda_agent
