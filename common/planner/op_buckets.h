// Internal to the planner: each sender's ops as they are generated, grouped by order key
// (phase, rotated receiver) and kept in generation order, then laid out key by key into the
// sender's final list. This replaces a counting pass over every (destination, source slice)
// pair: at Kimi-K2 scale that pass cost as much as generating the ops.
#pragma once

#include <malloc.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/planner/plan.h"

namespace wb::planner::internal {

class OpBuckets {
 public:
  explicit OpBuckets(size_t senders) : senders_(senders) {}

  void Add(int32_t sender, size_t key, const PlannedOp& op) {
    Sender& s = senders_[sender];
    if (s.last < 0 || s.buckets[s.last].key != key) s.last = Find(&s, key);
    Bucket& b = s.buckets[s.last];
    if (b.chunks.empty() || b.chunks.back().size() == b.chunks.back().capacity()) {
      // Chunks double up to kMaxChunk ops and are never reallocated: no copies while
      // generating, and at most one partly filled chunk per bucket.
      const size_t cap =
          b.chunks.empty() ? kFirstChunk : std::min(kMaxChunk, b.chunks.back().capacity() * 2);
      b.chunks.emplace_back();
      b.chunks.back().reserve(cap);
    }
    b.chunks.back().push_back(op);
  }

  // Appends each sender's ops from every shard to (*out)[sender]: keys ascending, and within
  // a key shard by shard in generation order, adding fanout_offset[shard] to each fan-out
  // group index. Frees the chunks as it goes, so the ops are held about once.
  static void MoveInto(const std::vector<OpBuckets*>& shards,
                       const std::vector<int32_t>& fanout_offset, std::vector<OpList>* out) {
    size_t moved = 0;
    struct Piece {
      size_t key;
      size_t shard;
      Bucket* bucket;
    };
    std::vector<Piece> pieces;
    for (size_t a = 0; a < out->size(); ++a) {
      pieces.clear();
      size_t total = 0;
      for (size_t sh = 0; sh < shards.size(); ++sh) {
        Sender& s = shards[sh]->senders_[a];
        for (Bucket& b : s.buckets) {
          pieces.push_back(Piece{b.key, sh, &b});
          for (const OpList& c : b.chunks) total += c.size();
        }
      }
      if (pieces.empty()) continue;
      std::sort(pieces.begin(), pieces.end(), [](const Piece& x, const Piece& y) {
        return x.key != y.key ? x.key < y.key : x.shard < y.shard;
      });
      OpList& ops = (*out)[a];
      ops.reserve(ops.size() + total);
      for (const Piece& p : pieces) {
        const int32_t offset = fanout_offset[p.shard];
        for (OpList& c : p.bucket->chunks) {
          const size_t first = ops.size();
          ops.insert(ops.end(), c.begin(), c.end());
          if (offset != 0) {
            for (size_t i = first; i < ops.size(); ++i) {
              if (ops[i].fanout >= 0) ops[i].fanout += offset;
            }
          }
          OpList().swap(c);
        }
      }
      for (OpBuckets* sh : shards) Sender().Swap(&sh->senders_[a]);
      // The freed chunks sit between live allocations in malloc's heap: hand their pages back
      // now and then, or the ops would be held twice at the peak (measured: 2.7 GiB instead
      // of 1.8 for Kimi-K2 TP 8).
      if (++moved % 4 == 0) malloc_trim(0);
    }
    malloc_trim(0);
  }

 private:
  static constexpr size_t kFirstChunk = 16;
  static constexpr size_t kMaxChunk = 4096;

  struct Bucket {
    size_t key = 0;
    std::vector<OpList> chunks;
  };
  struct Sender {
    std::vector<Bucket> buckets;
    std::unordered_map<size_t, int32_t> index;  // key -> position in buckets
    int32_t last = -1;                          // the bucket of the previous Add
    void Swap(Sender* o) {
      buckets.swap(o->buckets);
      index.swap(o->index);
      std::swap(last, o->last);
    }
  };

  static int32_t Find(Sender* s, size_t key) {
    auto [it, added] = s->index.emplace(key, static_cast<int32_t>(s->buckets.size()));
    if (added) s->buckets.push_back(Bucket{key, {}});
    return it->second;
  }

  std::vector<Sender> senders_;
};

}  // namespace wb::planner::internal
