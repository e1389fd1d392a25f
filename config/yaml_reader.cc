#include "config/yaml_reader.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wb::config {
namespace {

std::string Describe(const YAML::Node& node) {
  if (node.IsScalar()) return absl::StrCat("'", node.Scalar(), "'");
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  if (node.IsNull()) return "nothing";
  return "an unknown value";
}

// Missing keys and explicit nulls both mean "keep the default".
bool Absent(const YAML::Node& v) { return !v.IsDefined() || v.IsNull(); }

bool ParseInt(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);  // base 10: "010" is ten, not 8
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

}  // namespace

bool ParseByteCount(const std::string& text, uint64_t* out) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    ++i;
  }
  if (i == 0) return false;
  std::string number = text.substr(0, i);
  std::string unit = text.substr(i);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  double scale = 1;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "KiB") {
    scale = 1024.0;
  } else if (unit == "MiB") {
    scale = 1024.0 * 1024;
  } else if (unit == "GiB") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "KB") {
    scale = 1e3;
  } else if (unit == "MB") {
    scale = 1e6;
  } else if (unit == "GB") {
    scale = 1e9;
  } else {
    return false;
  }
  char* end = nullptr;
  double v = std::strtod(number.c_str(), &end);
  if (*end != '\0' || v < 0 || v * scale > 1.8e19) return false;
  *out = static_cast<uint64_t>(v * scale);
  return true;
}

YamlReader::YamlReader(YAML::Node node, std::string path, ReadContext* ctx)
    : node_(std::move(node)), path_(std::move(path)), ctx_(ctx) {
  if (!Absent(node_) && !node_.IsMap()) {
    ctx_->errors.push_back(absl::StrCat(ctx_->file, ": key '", path_.empty() ? "<top>" : path_,
                                        "': expected a mapping, got ", Describe(node_)));
    node_ = YAML::Node();
  }
}

std::string YamlReader::KeyPath(const std::string& key) const {
  return path_.empty() ? key : absl::StrCat(path_, ".", key);
}

void YamlReader::Error(const std::string& key, const std::string& expected,
                       const std::string& got) {
  ctx_->errors.push_back(
      absl::StrCat(ctx_->file, ": key '", KeyPath(key), "': expected ", expected, ", got ", got));
}

bool YamlReader::Has(const std::string& key) const {
  if (!node_.IsDefined() || !node_.IsMap()) return false;
  const YAML::Node& map = node_;
  return !Absent(map[key]);
}

YAML::Node YamlReader::Get(const std::string& key) {
  seen_.push_back(key);
  if (!node_.IsDefined() || !node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  const YAML::Node& map = node_;
  return map[key];
}

bool YamlReader::Require(const std::string& key) {
  if (Has(key)) return true;
  ctx_->errors.push_back(absl::StrCat(ctx_->file, ": key '", KeyPath(key), "' is required"));
  return false;
}

void YamlReader::ReadString(const std::string& key, std::string* out) {
  YAML::Node v = Get(key);
  if (Absent(v)) return;
  if (!v.IsScalar()) return Error(key, "a string", Describe(v));
  *out = v.Scalar();
}

void YamlReader::ReadBool(const std::string& key, bool* out) {
  YAML::Node v = Get(key);
  if (Absent(v)) return;
  const std::string s = v.IsScalar() ? v.Scalar() : "";
  if (s == "true" || s == "yes" || s == "on") {
    *out = true;
  } else if (s == "false" || s == "no" || s == "off") {
    *out = false;
  } else {
    Error(key, "true or false", Describe(v));
  }
}

void YamlReader::ReadInt(const std::string& key, int64_t min, int64_t max, int64_t* out) {
  YAML::Node v = Get(key);
  if (Absent(v)) return;
  int64_t value = 0;
  if (!v.IsScalar() || !ParseInt(v.Scalar(), &value)) {
    return Error(key, absl::StrCat("an integer from ", min, " to ", max), Describe(v));
  }
  if (value < min || value > max) {
    return Error(key, absl::StrCat("an integer from ", min, " to ", max), Describe(v));
  }
  *out = value;
}

void YamlReader::ReadInt(const std::string& key, int min, int max, int* out) {
  int64_t v = *out;
  ReadInt(key, int64_t{min}, int64_t{max}, &v);
  *out = static_cast<int>(v);
}

void YamlReader::ReadUint32(const std::string& key, uint32_t min, uint32_t max, uint32_t* out) {
  int64_t v = *out;
  ReadInt(key, int64_t{min}, int64_t{max}, &v);
  *out = static_cast<uint32_t>(v);
}

void YamlReader::ReadDouble(const std::string& key, double min, double max, double* out) {
  YAML::Node v = Get(key);
  if (Absent(v)) return;
  std::string expected = absl::StrCat("a number from ", min, " to ", max);
  if (!v.IsScalar()) return Error(key, expected, Describe(v));
  char* end = nullptr;
  double value = std::strtod(v.Scalar().c_str(), &end);
  // Written as "not inside" so that NaN (which strtod accepts) is refused too.
  if (v.Scalar().empty() || *end != '\0' || !(value >= min && value <= max)) {
    return Error(key, expected, Describe(v));
  }
  *out = value;
}

void YamlReader::ReadBytes(const std::string& key, uint64_t min, uint64_t max, uint64_t* out) {
  YAML::Node v = Get(key);
  if (Absent(v)) return;
  std::string expected =
      absl::StrCat("a byte count (e.g. 4096, 512MiB, 2GiB) from ", min, " to ", max);
  uint64_t value = 0;
  if (!v.IsScalar() || !ParseByteCount(v.Scalar(), &value) || value < min || value > max) {
    return Error(key, expected, Describe(v));
  }
  *out = value;
}

void YamlReader::ReadMode(const std::string& key, uint32_t* out) {
  YAML::Node v = Get(key);
  if (Absent(v)) return;
  const std::string s = v.IsScalar() ? v.Scalar() : "";
  char* end = nullptr;
  unsigned long value = std::strtoul(s.c_str(), &end, 8);
  if (s.empty() || *end != '\0' || value > 07777) {
    return Error(key, "an octal file mode such as 0660", Describe(v));
  }
  *out = static_cast<uint32_t>(value);
}

void YamlReader::ReadStringList(const std::string& key, std::vector<std::string>* out) {
  YAML::Node v = Get(key);
  if (Absent(v)) return;
  if (!v.IsSequence()) return Error(key, "a list of strings", Describe(v));
  std::vector<std::string> values;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].IsScalar()) {
      return Error(absl::StrCat(key, "[", i, "]"), "a string", Describe(v[i]));
    }
    values.push_back(v[i].Scalar());
  }
  *out = std::move(values);
}

void YamlReader::ReadEnum(const std::string& key, const std::vector<std::string>& allowed,
                          std::string* out) {
  YAML::Node v = Get(key);
  if (Absent(v)) return;
  std::string expected = absl::StrCat("one of ", absl::StrJoin(allowed, ", "));
  if (!v.IsScalar() || std::find(allowed.begin(), allowed.end(), v.Scalar()) == allowed.end()) {
    return Error(key, expected, Describe(v));
  }
  *out = v.Scalar();
}

YamlReader YamlReader::Child(const std::string& key) {
  return YamlReader(Get(key), KeyPath(key), ctx_);
}

std::vector<YamlReader> YamlReader::ChildList(const std::string& key) {
  std::vector<YamlReader> items;
  YAML::Node v = Get(key);
  if (Absent(v)) return items;
  if (!v.IsSequence()) {
    Error(key, "a list", Describe(v));
    return items;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    items.emplace_back(v[i], absl::StrCat(KeyPath(key), "[", i, "]"), ctx_);
  }
  return items;
}

void YamlReader::RejectUnknownKeys() {
  if (!node_.IsDefined() || !node_.IsMap()) return;
  for (const auto& kv : node_) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
    if (std::find(seen_.begin(), seen_.end(), key) == seen_.end()) {
      ctx_->errors.push_back(absl::StrCat(ctx_->file, ": unknown key '", KeyPath(key), "'"));
    }
  }
}

}  // namespace wb::config
