// Relays (relay.h): the planner step that chooses the relay tree with the cost model, and the
// readers of that tree.
#include "common/planner/relay.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <utility>

#include "common/planner/planner_internal.h"

namespace wb::planner {

namespace {

// Children of position p in a family of m members with `roots` roots and fan-out `fanout`:
// positions [roots + p * fanout, roots + (p + 1) * fanout) that exist.
int32_t ChildCount(int32_t p, int32_t roots, int32_t fanout, int32_t m) {
  const int64_t lo = int64_t{roots} + int64_t{p} * fanout;
  if (lo >= m) return 0;
  return static_cast<int32_t>(std::min<int64_t>(fanout, m - lo));
}

// Relay levels above position q (0 for a root).
int32_t Level(int32_t q, int32_t roots, int32_t fanout) {
  int32_t level = 0;
  while (q >= roots) q = (q - roots) / fanout, ++level;
  return level;
}

}  // namespace

int32_t RelayParent(const Plan& plan, int32_t agent) {
  if (!IsRelayed(plan, agent)) return -1;
  const RelayTree& r = plan.relay;
  const int32_t parent = (r.family_pos[agent] - r.roots) / r.fanout;
  return r.families[r.family_head[agent]][parent];
}

std::vector<int32_t> RelayChildren(const Plan& plan, int32_t agent) {
  const RelayTree& r = plan.relay;
  std::vector<int32_t> out;
  if (r.roots == 0) return out;
  const std::vector<int32_t>& family = r.families[r.family_head[agent]];
  const int32_t m = static_cast<int32_t>(family.size());
  const int32_t p = r.family_pos[agent];
  const int32_t n = ChildCount(p, r.roots, r.fanout, m);
  for (int32_t k = 0; k < n; ++k) out.push_back(family[r.roots + p * r.fanout + k]);
  return out;
}

namespace {

// Per agent with relay children, the runs of bytes landing in it (child-less agents: empty),
// from one pass over every sender's executed ops.
std::vector<OpList> LandedRuns(const std::vector<AgentLayout>& agents, const Plan& plan,
                               int32_t only) {
  const size_t na = plan.ops.size();
  // Per agent: region -> (its first entry, landed [begin, end) ranges).
  struct Landed {
    int32_t entry = -1;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
  };
  std::vector<std::map<uint64_t, Landed>> landed(na);
  std::vector<bool> wanted(na, false);
  bool any = false;
  for (size_t a = 0; a < na; ++a) {
    if ((only < 0 || static_cast<int32_t>(a) == only) &&
        !RelayChildren(plan, static_cast<int32_t>(a)).empty()) {
      wanted[a] = any = true;
    }
  }
  std::vector<OpList> out(na);
  if (!any) return out;
  // The direct plan's ops (executed ops, relayed destinations included): what lands in a
  // relayed agent from its parent is exactly what the direct plan would have sent it.
  for (int32_t a : plan.agent_order) {
    ForEachExecutedOp(plan, a, [&](const PlannedOp& op) {
      if (!wanted[op.dst_agent]) return;
      auto add = [&](int32_t entry, uint64_t begin, uint64_t end) {
        Landed& l = landed[op.dst_agent][EntryRegion(agents, op.dst_agent, entry)];
        if (l.entry < 0 || entry < l.entry) l.entry = entry;
        l.ranges.emplace_back(begin, end);
      };
      const uint64_t row = op.row_elems * DTypeBytes(op.DstDType());
      for (uint64_t r = 0; r < op.rows; ++r) {
        add(op.dst_tensor, op.dst_offset + r * op.dst_stride,
            op.dst_offset + r * op.dst_stride + row);
      }
      if (op.GetTransform() != weightbeam::v1::TRANSFORM_FP8_BLOCK) return;
      const uint64_t block_rows = (op.rows + kFp8Block - 1) / kFp8Block;
      const uint64_t scale_row = (op.row_elems + kFp8Block - 1) / kFp8Block * 4;
      for (uint64_t r = 0; r < block_rows; ++r) {
        add(op.scale_tensor, op.scale_offset + r * op.scale_stride,
            op.scale_offset + r * op.scale_stride + scale_row);
      }
    });
  }
  for (size_t a = 0; a < na; ++a) {
    if (!wanted[a]) continue;
    for (auto& [region, l] : landed[a]) {
      std::sort(l.ranges.begin(), l.ranges.end());
      size_t i = 0;
      while (i < l.ranges.size()) {
        const uint64_t begin = l.ranges[i].first;
        uint64_t end = l.ranges[i].second;
        while (++i < l.ranges.size() && l.ranges[i].first <= end) {
          end = std::max(end, l.ranges[i].second);
        }
        for (uint64_t at = begin; at < end; at += kRelayChunkBytes) {
          PlannedOp op;
          op.src_agent = static_cast<int32_t>(a);
          op.src_tensor = op.dst_tensor = l.entry;
          op.src_offset = op.dst_offset = at;
          op.rows = 1;
          op.row_elems = std::min(end - at, kRelayChunkBytes);
          op.src_stride = op.dst_stride = op.row_elems;
          op.src_dtype = op.dst_dtype = weightbeam::v1::DTYPE_U8;
          op.transform = weightbeam::v1::TRANSFORM_COPY;
          op.relay = 1;
          out[a].push_back(op);
        }
      }
    }
    std::map<uint64_t, Landed>().swap(landed[a]);
  }
  return out;
}

OpList ForChildren(const Plan& plan, int32_t agent, const OpList& runs) {
  OpList out;
  for (int32_t child : RelayChildren(plan, agent)) {
    for (PlannedOp op : runs) {
      op.dst_agent = child;
      out.push_back(op);
    }
  }
  return out;
}

}  // namespace

OpList RelayOps(const std::vector<AgentLayout>& agents, const Plan& plan, int32_t agent) {
  return ForChildren(plan, agent, LandedRuns(agents, plan, agent)[agent]);
}

std::vector<OpList> AllRelayOps(const std::vector<AgentLayout>& agents, const Plan& plan) {
  std::vector<OpList> runs = LandedRuns(agents, plan, -1);
  std::vector<OpList> out(runs.size());
  for (size_t a = 0; a < runs.size(); ++a) {
    if (!runs[a].empty()) out[a] = ForChildren(plan, static_cast<int32_t>(a), runs[a]);
  }
  return out;
}

namespace internal {

void Planner::PlanRelays() {
  RelayTree& tree = plan_.relay;
  PlanStats& s = plan_.stats;
  const size_t na = agents_.size();
  const size_t nr = rail_base_.back();
  const double overhead = options_.cost.op_overhead_us * 1e-6;
  tree = RelayTree{};
  tree.direct_fallback = options_.relays.direct_fallback;
  tree.family_head.resize(na);
  std::iota(tree.family_head.begin(), tree.family_head.end(), 0);
  tree.family_pos.assign(na, 0);
  tree.families.assign(na, {});
  tree.relay_send_bytes.assign(na, 0);
  tree.relay_send_ops.assign(na, 0);
  // The receivers' limit: nothing a relay does changes what each receiver takes.
  const double recv_time = recv_limit_seconds_;
  tree.receiver_limit_seconds = recv_time;
  tree.direct_predicted_seconds = tree.predicted_seconds = s.predicted_step_seconds;
  if (!options_.relays.enabled || !options_.fan_out) return;

  // Families: a receiving template and its mirrors, by replica shift then name (never by
  // input position, so the tree does not depend on the order agents are listed in).
  int32_t width = 1;  // the largest family
  for (size_t a = 0; a < na; ++a) {
    if (IsMirror(a) || mirrors_[a].empty() || !s.is_receiver[a]) continue;
    std::vector<int32_t> members = mirrors_[a];
    std::sort(members.begin(), members.end(), [&](int32_t x, int32_t y) {
      if (delta_[x] != delta_[y]) return delta_[x] < delta_[y];
      return agents_[x].name < agents_[y].name;
    });
    members.insert(members.begin(), static_cast<int32_t>(a));
    for (size_t p = 0; p < members.size(); ++p) {
      tree.family_head[members[p]] = static_cast<int32_t>(a);
      tree.family_pos[members[p]] = static_cast<int32_t>(p);
    }
    width = std::max<int32_t>(width, members.size());
    tree.families[a] = std::move(members);
  }
  for (size_t a = 0; a < na; ++a) {
    if (tree.families[a].empty()) tree.families[a] = {static_cast<int32_t>(a)};
  }
  if (width < 2) return;
  // Relay ops per forwarding: about one per chunk of each destination region (RelayOps), the
  // same for a template and its mirrors.
  std::vector<double> relay_ops(na, 0);
  for (size_t a = 0; a < na; ++a) {
    if (tree.families[a].size() < 2) continue;
    std::vector<std::pair<uint64_t, uint64_t>> regions;  // (region, bytes)
    for (const TensorEntry& e : agents_[a].tensors) {
      if (e.owner.role == Role::kInference) regions.emplace_back(e.region, e.region_bytes);
    }
    std::sort(regions.begin(), regions.end());
    regions.erase(std::unique(regions.begin(), regions.end(),
                              [](const auto& x, const auto& y) { return x.first == y.first; }),
                  regions.end());
    double ops = 0;
    for (const auto& [region, bytes] : regions) {
      ops += static_cast<double>((bytes + kRelayChunkBytes - 1) / kRelayChunkBytes);
    }
    for (int32_t member : tree.families[a]) relay_ops[member] = ops;
  }

  // What each sending rail and device sends to destinations at each family position, as
  // difference arrays over positions: a mirrored group's listed template stands for positions
  // [0, m) of its family, any other destination for its own position.
  const size_t ngroups = plan_.fanout_begin.empty() ? 0 : plan_.fanout_begin.size() - 1;
  struct Range {
    int32_t lo, hi;
    uint32_t count;
  };
  std::vector<uint32_t> range_begin(ngroups + 1, 0);
  std::vector<Range> ranges;
  for (size_t g = 0; g < ngroups; ++g) {
    range_begin[g] = static_cast<uint32_t>(ranges.size());
    const bool mirrored = plan_.fanout_mirrored[g] != 0;
    for (uint32_t i = plan_.fanout_begin[g]; i < plan_.fanout_begin[g + 1]; ++i) {
      const int32_t d = plan_.fanout_dsts[i].agent;
      Range r{tree.family_pos[d], tree.family_pos[d] + 1, 1};
      if (mirrored) r = {0, static_cast<int32_t>(1 + plan_.mirrors[d].size()), 1};
      auto same = std::find_if(ranges.begin() + range_begin[g], ranges.end(),
                               [&](const Range& x) { return x.lo == r.lo && x.hi == r.hi; });
      if (same != ranges.end()) {
        ++same->count;
      } else {
        ranges.push_back(r);
      }
    }
  }
  range_begin[ngroups] = static_cast<uint32_t>(ranges.size());
  const size_t w1 = static_cast<size_t>(width) + 1;
  const size_t nd = dev_base_.back();
  std::vector<double> rail_bytes(nr * w1, 0), rail_ops(nr * w1, 0), dev_bytes(nd * w1, 0);
  uint64_t max_op = 0;
  for (size_t a = 0; a < na; ++a) {
    for (const PlannedOp& op : plan_.ops[a]) {
      const size_t k = (rail_base_[a] + op.rail) * w1;
      const size_t dv = static_cast<size_t>(tensor_dev_[a][op.src_tensor]) * w1;
      const double b = static_cast<double>(op.DstBytes());
      max_op = std::max<uint64_t>(max_op, op.DstBytes());
      auto add = [&](int32_t lo, int32_t hi, double c) {
        rail_bytes[k + lo] += b * c, rail_bytes[k + hi] -= b * c;
        rail_ops[k + lo] += c, rail_ops[k + hi] -= c;
        dev_bytes[dv + lo] += b * c, dev_bytes[dv + hi] -= b * c;
      };
      if (op.fanout < 0) {
        const int32_t p = tree.family_pos[op.dst_agent];
        add(p, p + 1, 1);
        continue;
      }
      for (uint32_t i = range_begin[op.fanout]; i < range_begin[op.fanout + 1]; ++i) {
        add(ranges[i].lo, ranges[i].hi, ranges[i].count);
      }
    }
  }
  // Differences -> per position -> sent to positions below r (index r), in place.
  auto cumulate = [&](std::vector<double>* v, size_t rows) {
    for (size_t i = 0; i < rows; ++i) {
      double* x = v->data() + i * w1;
      double per = 0, below = 0;
      for (size_t p = 0; p < w1; ++p) {
        per += x[p];
        const double here = per;
        x[p] = below;
        below += here;
      }
    }
  };
  cumulate(&rail_bytes, nr);
  cumulate(&rail_ops, nr);
  cumulate(&dev_bytes, nd);

  const double delay =
      static_cast<double>(std::min(max_op, kRelayChunkBytes)) / (options_.cost.nic_gbps * 1e9) +
      overhead;
  // The predicted step with `roots` roots and fan-out `fanout` (roots >= width: no relays),
  // and its link limit and relay depth.
  auto predict = [&](int32_t roots, int32_t fanout, double* link, int32_t* levels) {
    double send = 0, relay = 0, limit = recv_time;
    int32_t depth = 0;
    for (size_t a = 0; a < na; ++a) {
      const int rails = rail_base_[a + 1] - rail_base_[a];
      if (s.is_sender[a]) {
        for (int k = 0; k < rails; ++k) {
          const double gbps = RailGbps(a, k) * 1e9;
          const size_t i = (rail_base_[a] + k) * w1 + roots;
          send = std::max(send, rail_bytes[i] / gbps + rail_ops[i] * overhead);
          limit = std::max(limit, rail_bytes[i] / gbps);
        }
      }
      const int32_t m = static_cast<int32_t>(tree.families[tree.family_head[a]].size());
      const int32_t ch = ChildCount(tree.family_pos[a], roots, fanout, m);
      if (m > 1) depth = std::max(depth, Level(m - 1, roots, fanout));
      if (ch == 0) continue;
      for (int k = 0; k < rails; ++k) {
        const double gbps = RailGbps(a, k) * 1e9;
        const double bytes = ch * recv_rail_[rail_base_[a] + k];
        relay = std::max(relay, bytes / gbps + ch * relay_ops[a] / rails * overhead);
        limit = std::max(limit, bytes / gbps);
      }
    }
    if (link != nullptr) *link = limit;
    if (levels != nullptr) *levels = depth;
    return std::max({send, recv_time, relay}) + depth * delay;
  };

  const double direct = predict(width, 1, nullptr, nullptr);
  double best = direct;
  int32_t best_roots = 0, best_fanout = 0;
  if (options_.relays.roots > 0) {
    best_roots = std::min(options_.relays.roots, width);
    best_fanout = std::max(1, options_.relays.fanout);
    if (best_roots >= width) best_roots = 0;
    if (best_roots > 0) best = predict(best_roots, best_fanout, nullptr, nullptr);
  } else {
    // Fewest relayed bytes first (fan-out 1, most roots); a tree must beat the best so far by
    // 0.5 % to be taken, so a relay never replaces a direct op that is as fast.
    for (int32_t fanout = 1; fanout <= 4; ++fanout) {
      for (int32_t roots = width - 1; roots >= 1; --roots) {
        const double t = predict(roots, fanout, nullptr, nullptr);
        if (t < best * 0.995) best = t, best_roots = roots, best_fanout = fanout;
      }
    }
  }
  tree.direct_predicted_seconds = direct;
  tree.predicted_seconds = best;
  tree.pipeline_delay_seconds = delay;
  if (best_roots == 0) return;

  tree.roots = best_roots;
  tree.fanout = best_fanout;
  double link = 0;
  predict(best_roots, best_fanout, &link, &tree.depth);
  // The statistics describe the plan as executed: senders send to the roots only, relays
  // forward what they received once per child.
  for (size_t a = 0; a < na; ++a) {
    const int32_t m = static_cast<int32_t>(tree.families[tree.family_head[a]].size());
    if (s.is_sender[a]) {
      double bytes = 0, ops = 0;
      for (int32_t k = rail_base_[a]; k < rail_base_[a + 1]; ++k) {
        bytes += rail_bytes[k * w1 + best_roots];
        ops += rail_ops[k * w1 + best_roots];
      }
      s.send_bytes[a] = static_cast<uint64_t>(bytes + 0.5);
      s.send_ops[a] = static_cast<uint64_t>(ops + 0.5);
    }
    const int32_t ch = ChildCount(tree.family_pos[a], best_roots, best_fanout, m);
    if (ch > 0) {
      tree.relay_send_bytes[a] = ch * s.recv_bytes[a];
      tree.relay_send_ops[a] = static_cast<uint64_t>(ch * relay_ops[a]);
      tree.relayed_bytes += tree.relay_send_bytes[a];
      s.send_bytes[a] += tree.relay_send_bytes[a];
      s.send_ops[a] += tree.relay_send_ops[a];
    }
  }
  s.total_bytes = s.total_ops = 0;
  std::vector<uint64_t> senders;
  for (size_t a = 0; a < na; ++a) {
    s.total_bytes += s.send_bytes[a];
    s.total_ops += s.send_ops[a];
    if (s.is_sender[a]) senders.push_back(s.send_bytes[a]);
  }
  s.sender_imbalance = Imbalance(senders);
  s.sender_device_bytes.clear();
  for (size_t d = 0; d < nd; ++d) {
    if (s.device_send_bytes[d] == 0) continue;
    s.device_send_bytes[d] = static_cast<uint64_t>(dev_bytes[d * w1 + best_roots] + 0.5);
    s.sender_device_bytes.push_back(s.device_send_bytes[d]);
  }
  s.sender_device_imbalance = Imbalance(s.sender_device_bytes);
  s.predicted_step_seconds = best;
  s.link_limit_seconds = link;
  plan_.hash =
      Mix(Mix(plan_.hash, static_cast<uint64_t>(best_roots)), static_cast<uint64_t>(best_fanout));
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(plan_.hash));
  plan_.hash_hex = buf;
}

}  // namespace internal

}  // namespace wb::planner
