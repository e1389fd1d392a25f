// Safetensors reader/writer: the header is built and parsed with nlohmann_json; file I/O is
// plain POSIX so that fsync and rename give the atomicity the storage path relies on.
#include "daemon/storage/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace wb::storage {
namespace {

// A header larger than this is refused rather than allocated (safetensors uses the same cap).
constexpr uint64_t kMaxHeaderBytes = 100 << 20;

struct DtypeInfo {
  const char* name;
  int bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
    {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},
    {"I32", 4},  {"F32", 4}, {"U64", 8}, {"I64", 8},     {"F64", 8},
};

std::string Errno(int err) { return std::strerror(err); }

absl::Status WriteAll(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("writing ", path, ": ", Errno(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

std::string DirOf(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Writes the pieces to `path.tmp`, fsyncs, renames over `path`, fsyncs the directory.
absl::Status WritePiecesAtomically(const std::string& path,
                                   const std::vector<absl::Span<const uint8_t>>& pieces) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("creating ", tmp, ": ", Errno(errno)));
  absl::Status s;
  for (const auto& piece : pieces) {
    s = WriteAll(fd, piece.data(), piece.size(), tmp);
    if (!s.ok()) break;
  }
  if (s.ok() && ::fsync(fd) != 0) {
    s = absl::InternalError(absl::StrCat("fsync of ", tmp, ": ", Errno(errno)));
  }
  if (::close(fd) != 0 && s.ok()) {
    s = absl::InternalError(absl::StrCat("closing ", tmp, ": ", Errno(errno)));
  }
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::InternalError(absl::StrCat("renaming ", tmp, " to ", path, ": ", Errno(errno)));
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  // Make the rename itself durable (best effort: some shared file systems refuse this).
  int dir = ::open(DirOf(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
  return absl::OkStatus();
}

bool ShapeElements(const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      return false;
    }
    n *= static_cast<uint64_t>(d);
  }
  *out = n;
  return true;
}

// Reads a JSON integer that must fit in [0, 2^63).
bool NonNegative(const nlohmann::json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return *out <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

}  // namespace

int DtypeBytes(const std::string& dtype) {
  for (const auto& d : kDtypes) {
    if (dtype == d.name) return d.bytes;
  }
  return 0;
}

void StreamHash::Update(absl::Span<const uint8_t> bytes) {
  constexpr uint64_t kPrime = 0x100000001b3ull;
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  total_ += n;
  while (n > 0 && tail_len_ > 0 && tail_len_ < 8) {
    tail_[tail_len_++] = *p++;
    --n;
  }
  if (tail_len_ == 8) {
    uint64_t w;
    std::memcpy(&w, tail_, 8);
    h_ = (h_ ^ w) * kPrime;
    h_ ^= h_ >> 29;
    tail_len_ = 0;
  }
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h_ = (h_ ^ w) * kPrime;
    h_ ^= h_ >> 29;
  }
  for (; n > 0; --n) tail_[tail_len_++] = *p++;
}

uint64_t StreamHash::Final() const {
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t h = h_;
  for (int i = 0; i < tail_len_; ++i) h = (h ^ tail_[i]) * kPrime;
  h = (h ^ total_) * kPrime;
  return h ^ (h >> 31);
}

uint64_t TensorEntry::elements() const {
  uint64_t n = 0;
  return ShapeElements(shape, &n) ? n : 0;
}

absl::StatusOr<WrittenFile> WriteSafetensors(const std::string& path,
                                             const std::vector<TensorToWrite>& tensors,
                                             const std::map<std::string, std::string>& metadata,
                                             const ByteObserver& observe) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const int elem = DtypeBytes(t.dtype);
    uint64_t elements = 0;
    if (elem == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", t.name, "': unknown dtype '", t.dtype, "'"));
    }
    if (!ShapeElements(t.shape, &elements) || elements * elem != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", t.name,
                                                     "': ", t.data.size(),
                                                     " bytes do not match its shape and dtype"));
    }
    if (t.name == "__metadata__" || header.contains(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name '", t.name, "' is used twice or reserved"));
    }
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string json = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as the reference implementation does.
  json.append((8 - (json.size() % 8)) % 8, ' ');
  uint8_t prefix[8];
  const uint64_t len = json.size();
  std::memcpy(prefix, &len, 8);  // little-endian hosts only (x86-64, aarch64)

  std::vector<absl::Span<const uint8_t>> pieces;
  pieces.emplace_back(prefix, 8);
  pieces.emplace_back(reinterpret_cast<const uint8_t*>(json.data()), json.size());
  for (const auto& t : tensors) pieces.push_back(t.data);
  WrittenFile out;
  StreamHash hash;
  for (const auto& p : pieces) {
    hash.Update(p);
    if (observe) observe(p);
    out.bytes += p.size();
  }
  out.checksum = hash.Final();
  if (auto s = WritePiecesAtomically(path, pieces); !s.ok()) return s;
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, absl::Span<const uint8_t> bytes) {
  return WritePiecesAtomically(path, {bytes});
}

absl::StatusOr<std::vector<uint8_t>> ReadWholeFile(const std::string& path, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", Errno(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("fstat of ", path, ": ", Errno(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": not a regular file"));
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return absl::OutOfRangeError(
        absl::StrCat(path, ": ", st.st_size, " bytes, more than the ", max_bytes, " expected"));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = r < 0 ? errno : 0;
      ::close(fd);
      return absl::DataLossError(
          absl::StrCat("reading ", path, ": ", err ? Errno(err) : "file shrank while reading"));
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  return bytes;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  auto bytes = ReadWholeFile(path);
  if (!bytes.ok()) return bytes.status();
  return Parse(std::move(*bytes), path);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::vector<uint8_t> bytes,
                                                       std::string source) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(source, ": not a valid safetensors file: ", what));
  };
  if (bytes.size() < 8) {
    return bad(absl::StrCat(bytes.size(), " bytes is shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > kMaxHeaderBytes || header_len > bytes.size() - 8) {
    return bad(absl::StrCat("header length ", header_len, " exceeds the ", bytes.size() - 8,
                            " bytes that follow (truncated?)"));
  }
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  nlohmann::json header = nlohmann::json::parse(text, text + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return bad("the header is not a JSON object");
  }
  SafetensorsFile file;
  file.source_ = source;  // `bad` above still names it
  file.data_start_ = 8 + header_len;
  const uint64_t data_size = bytes.size() - file.data_start_;
  // (begin, end, name) for the overlap check; empty tensors (no changed element) hold no bytes.
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> order;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return bad(absl::StrCat("__metadata__ key '", m.key(), "' is not a string"));
        }
        file.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor '", name, "': ");
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets")) {
      return bad(where + "needs dtype, shape and data_offsets");
    }
    TensorEntry e;
    if (!v["dtype"].is_string() || DtypeBytes(v["dtype"].get<std::string>()) == 0) {
      return bad(absl::StrCat(where, "unknown dtype ", v["dtype"].dump()));
    }
    e.dtype = v["dtype"].get<std::string>();
    if (!v["shape"].is_array()) return bad(where + "shape is not an array");
    for (const auto& d : v["shape"]) {
      uint64_t dim = 0;
      if (!NonNegative(d, &dim)) return bad(absl::StrCat(where, "bad dimension ", d.dump()));
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !NonNegative(off[0], &e.begin) ||
        !NonNegative(off[1], &e.end) || e.begin > e.end) {
      return bad(absl::StrCat(where, "data_offsets ", off.dump(), " is not [begin, end]"));
    }
    if (e.end > data_size) {
      return bad(absl::StrCat(where, "data_offsets [", e.begin, ", ", e.end, "] exceed the ",
                              data_size, " data bytes (truncated?)"));
    }
    uint64_t elements = 0;
    if (!ShapeElements(e.shape, &elements) ||
        elements > std::numeric_limits<uint64_t>::max() / DtypeBytes(e.dtype) ||
        elements * DtypeBytes(e.dtype) != e.end - e.begin) {
      return bad(absl::StrCat(where, e.end - e.begin, " data bytes do not match shape ",
                              v["shape"].dump(), " of ", e.dtype));
    }
    if (e.end > e.begin) order.emplace_back(e.begin, e.end, name);
    file.tensors_[name] = std::move(e);
  }
  std::sort(order.begin(), order.end());
  uint64_t covered = 0;
  for (const auto& [begin, end, name] : order) {
    const TensorEntry& e = file.tensors_[name];
    if (begin < covered) {
      return bad(absl::StrCat("tensor '", name, "': data_offsets [", e.begin, ", ", e.end,
                              "] overlap another tensor"));
    }
    covered = e.end;
  }
  if (covered != data_size) {
    return bad(absl::StrCat(data_size - covered, " bytes after the last tensor belong to none"));
  }
  file.bytes_ = std::move(bytes);
  return file;
}

const TensorEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::Span<const uint8_t> SafetensorsFile::Data(const TensorEntry& entry) const {
  return absl::Span<const uint8_t>(bytes_.data() + data_start_ + entry.begin,
                                   entry.end - entry.begin);
}

}  // namespace wb::storage
