// Aligned text tables for wbctl's human output.
#pragma once

#include <string>
#include <vector>

namespace wb::client {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Columns padded to their widest cell, separated by two spaces.
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

std::string HumanBytes(double bytes);

}  // namespace wb::client
