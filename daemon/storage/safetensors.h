// A small, strict reader and writer of safetensors files (the storage path's on-disk format):
// 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and
// data_offsets plus a `__metadata__` string map, then the data. Writes are atomic (tmp, fsync,
// rename); reads validate everything and name the file and tensor in every error.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace wb::storage {

// Bytes per element of a safetensors dtype ("BF16", "U32", ...); 0 when unknown.
int DtypeBytes(const std::string& dtype);

// A 64-bit hash of a byte stream (FNV-style over 8-byte words; not cryptographic). Detects
// corrupted files; the same bytes give the same value in any process.
class StreamHash {
 public:
  void Update(absl::Span<const uint8_t> bytes);
  uint64_t Final() const;

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
  uint8_t tail_[8] = {};
  int tail_len_ = 0;
  uint64_t total_ = 0;
};

// A tensor to write: the bytes are written as they are (row-major, little-endian).
struct TensorToWrite {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> data;
};

struct WrittenFile {
  uint64_t bytes = 0;     // size of the file
  uint64_t checksum = 0;  // StreamHash of the whole file
};

// Sees every byte of a file as it is written, in order (e.g. a SHA-256 of it).
using ByteObserver = std::function<void(absl::Span<const uint8_t>)>;

// Writes `path` atomically: to `path + ".tmp"`, fsync, rename, fsync of the directory. A reader
// never sees half a file. Tensors are stored in the order given; names must be unique.
absl::StatusOr<WrittenFile> WriteSafetensors(const std::string& path,
                                             const std::vector<TensorToWrite>& tensors,
                                             const std::map<std::string, std::string>& metadata,
                                             const ByteObserver& observe = nullptr);

struct TensorEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offsets into the data section
  uint64_t end = 0;
  uint64_t elements() const;
};

// A whole file read into memory and validated: header length in bounds, JSON well formed,
// every dtype known, shapes non-negative, offsets in bounds, sizes matching the shapes, no
// overlaps, no bytes left over, metadata values strings.
class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);
  // `source` names the bytes in errors (a path).
  static absl::StatusOr<SafetensorsFile> Parse(std::vector<uint8_t> bytes, std::string source);

  const std::string& source() const { return source_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  const TensorEntry* Find(const std::string& name) const;
  absl::Span<const uint8_t> Data(const TensorEntry& entry) const;
  // The file's bytes as read (for checksums).
  absl::Span<const uint8_t> bytes() const { return bytes_; }

 private:
  std::string source_;
  std::vector<uint8_t> bytes_;
  uint64_t data_start_ = 0;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorEntry> tensors_;
};

// Reads a whole regular file (anything else is refused without blocking: a FIFO planted in the
// directory must not hang the reader); a file over `max_bytes` is refused before anything is
// allocated (OUT_OF_RANGE). Errors name it.
absl::StatusOr<std::vector<uint8_t>> ReadWholeFile(
    const std::string& path, uint64_t max_bytes = std::numeric_limits<uint64_t>::max());
// Writes `bytes` to `path` atomically (tmp, fsync, rename).
absl::Status WriteFileAtomically(const std::string& path, absl::Span<const uint8_t> bytes);

}  // namespace wb::storage
