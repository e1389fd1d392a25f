// Reads a YAML mapping into typed fields while tracking the key path, so every error names
// the file, the key and what was expected, and unknown keys are reported, not ignored.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace wb::config {

// Shared by all readers of one file: the file name and the errors found so far.
struct ReadContext {
  std::string file;
  std::vector<std::string> errors;
};

class YamlReader {
 public:
  YamlReader(YAML::Node node, std::string path, ReadContext* ctx);

  // Each Read* leaves `out` unchanged when the key is absent (the default stays) and records
  // an error when the key is present with a bad value.
  void ReadString(const std::string& key, std::string* out);
  void ReadBool(const std::string& key, bool* out);
  void ReadInt(const std::string& key, int64_t min, int64_t max, int64_t* out);
  void ReadInt(const std::string& key, int min, int max, int* out);
  void ReadUint32(const std::string& key, uint32_t min, uint32_t max, uint32_t* out);
  void ReadDouble(const std::string& key, double min, double max, double* out);
  // A byte count: an integer or a number with a unit (KiB, MiB, GiB, KB, MB, GB).
  void ReadBytes(const std::string& key, uint64_t min, uint64_t max, uint64_t* out);
  // An octal file mode written as 0660 or "0660".
  void ReadMode(const std::string& key, uint32_t* out);
  void ReadStringList(const std::string& key, std::vector<std::string>* out);
  void ReadEnum(const std::string& key, const std::vector<std::string>& allowed, std::string* out);
  // Records "missing required key" unless present.
  bool Require(const std::string& key);

  // A nested mapping; absent keys give an empty reader (all defaults).
  YamlReader Child(const std::string& key);
  // A sequence of mappings under `key`.
  std::vector<YamlReader> ChildList(const std::string& key);

  bool Has(const std::string& key) const;
  // Records an error for every key of this mapping that no Read*/Child call asked for.
  void RejectUnknownKeys();
  void Error(const std::string& key, const std::string& expected, const std::string& got);
  const std::string& path() const { return path_; }

 private:
  std::string KeyPath(const std::string& key) const;
  YAML::Node Get(const std::string& key);

  YAML::Node node_;
  std::string path_;
  ReadContext* ctx_;
  std::vector<std::string> seen_;
};

// Parses a byte count such as "512MiB", "1GiB", "4096". Returns false on bad input.
bool ParseByteCount(const std::string& text, uint64_t* out);

}  // namespace wb::config
