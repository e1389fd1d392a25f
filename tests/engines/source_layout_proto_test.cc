// The SourceLayout answer (what `source_layout` / `register_hf_shards` ask the agent for) with
// `whole_small`: a tensor of fewer align_rows blocks than ranks is held whole by one rank, every
// other tensor exactly as without it, and each tensor's rows tile it once over the ranks.
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "common/engines/engine_layout_proto.h"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("SourceLayout: whole_small holds tensors of fewer blocks than ranks whole") {
  const std::string config = ReadFile("tests/python/engine_configs/deepseek_v3.json");
  const int world = 8;
  // Per tensor, per rank: (start, size) with and without whole_small.
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> whole, blocks;
  std::map<std::string, int64_t> rows;
  for (bool small : {true, false}) {
    for (int rank = 0; rank < world; ++rank) {
      weightbeam::v1::SourceLayoutRequest req;
      req.set_config_json(config);
      req.set_rank(rank);
      req.set_world(world);
      req.set_align_rows(128);
      req.set_whole_small(small);
      auto resp = wb::engines::AnswerSourceLayout(req);
      REQUIRE(resp.ok());
      for (const auto& t : resp->tensors()) {
        rows[t.name()] = t.shape(0);
        (small ? whole : blocks)[t.name()].emplace_back(t.rows().start(), t.rows().size());
      }
    }
  }
  int held_whole = 0;
  for (const auto& [name, r] : rows) {
    INFO(name << " rows " << r);
    const auto& w = whole.at(name);
    const auto& b = blocks.at(name);
    REQUIRE(w.size() == static_cast<size_t>(world));
    int64_t covered = 0;
    int holders = 0;
    for (const auto& [start, size] : w) {
      covered += size;
      holders += size > 0;
    }
    CHECK(covered == r);  // rows held once over the ranks
    if ((r + 127) / 128 < world) {
      CHECK(holders == 1);
      for (const auto& [start, size] : w) CHECK((size == 0 || (start == 0 && size == r)));
      ++held_whole;
    } else {
      // Cut as without whole_small (the first rank may differ: whole tensors before it take
      // one rank each), in the same chunks.
      std::vector<std::pair<int64_t, int64_t>> sw = w, sb = b;
      std::sort(sw.begin(), sw.end());
      std::sort(sb.begin(), sb.end());
      CHECK(sw == sb);
    }
  }
  CHECK(held_whole > 0);
}
