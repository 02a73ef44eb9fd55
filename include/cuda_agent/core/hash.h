// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), self-contained: content-addressed cache keys,
// authenticated results and cache entries, and the random secrets that key them.
#pragma once

#include <array>
#include <cstdint>
#include <span>
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
  // The same digest as 32 raw bytes.
  std::array<uint8_t, 32> digest() const;

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;         // bytes waiting in buffer_, always < 64
  uint64_t total_bytes_ = 0;    // message length so far
};

// SHA-256 of `data` as 64 lowercase hex digits. Thread-safe.
std::string sha256_hex(std::string_view data);

// Lowercase hex of `bytes`.
std::string to_hex(std::span<const uint8_t> bytes);

// HMAC-SHA256 of `message` under `key` (any length), raw or as 64 hex digits. Thread-safe.
std::array<uint8_t, 32> hmac_sha256(std::string_view key, std::string_view message);
std::string hmac_sha256_hex(std::string_view key, std::string_view message);

// Compares two strings (MACs) in time that depends only on their length.
bool constant_time_equal(std::string_view a, std::string_view b);

// `n` bytes from the kernel's random source (getrandom), raw or as 2n hex digits: secrets for
// keys. Throws Error when the kernel refuses. Thread-safe.
std::string random_bytes(size_t n);
std::string random_hex(size_t n);

}  // namespace cuda_agent
