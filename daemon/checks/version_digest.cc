#include "daemon/checks/version_digest.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "daemon/checks/tensor_pieces.h"
#include "daemon/delta/op_layout.h"

namespace wb::checks {

namespace v1 = weightbeam::v1;

absl::StatusOr<std::vector<v1::RankDigest>> DigestDestinations(
    const std::vector<std::shared_ptr<const registry::RegisteredTensor>>& tensors) {
  // (replica, rank) -> (name, content hash), sorted by name below.
  std::map<std::pair<int32_t, int32_t>, std::vector<std::pair<std::string, uint64_t>>> groups;
  for (const auto& t : tensors) {
    if (t->owner.role() != v1::ROLE_INFERENCE) continue;
    uint64_t h = 0x9e3779b97f4a7c15ull;
    if (auto s = ReadPieces(*t, [&](const uint8_t* data, uint64_t n,
                                    uint64_t) { h = delta::HashBytes(data, n, h); });
        !s.ok()) {
      return s;
    }
    groups[{t->owner.replica(), t->owner.rank()}].emplace_back(t->spec.name(), h);
  }
  std::vector<v1::RankDigest> out;
  for (auto& [key, named] : groups) {
    std::sort(named.begin(), named.end());
    uint64_t d = 0;
    for (const auto& [name, h] : named) {
      d = delta::HashBytes(reinterpret_cast<const uint8_t*>(name.data()), name.size(), d);
      d = delta::HashBytes(reinterpret_cast<const uint8_t*>(&h), sizeof(h), d);
    }
    v1::RankDigest r;
    r.set_replica(key.first);
    r.set_rank(key.second);
    r.set_digest(d);
    out.push_back(r);
  }
  return out;
}

}  // namespace wb::checks
