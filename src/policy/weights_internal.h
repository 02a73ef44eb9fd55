// Pieces shared by the weight-file readers and writers; not part of the public API.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace cuda_agent::policy::detail {

// A whole file mapped read-only (MAP_PRIVATE), unmapped on destruction. An empty file maps to
// nothing (data() null, size() 0). Throws Error naming the path and the system's reason.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Little-endian appends into a byte string (the writers build whole files in memory, then
// write them atomically).
template <typename T>
void append_le(std::string& out, T value) {
  static_assert(std::endian::native == std::endian::little, "big-endian hosts are not supported");
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// product(shape) with overflow and negative-dimension checks; `what` names the tensor and file.
int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what);

// "[2, 3]"
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace cuda_agent::policy::detail
