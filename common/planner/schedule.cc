// Planner steps after generation: source choice (balancing), ordering, rails, statistics,
// cost model and hash.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parallel/parallel_for.h"
#include "common/planner/planner_internal.h"

namespace wb::planner {
namespace internal {

void Planner::BuildDevices() {
  // A mirror has its template's devices (dev_base_ of its own), so templates come first.
  dev_base_.assign(agents_.size() + 1, 0);
  tensor_dev_.resize(agents_.size());
  std::vector<int32_t> dev_count(agents_.size(), 0);
  // Per template agent, on every thread: its device slots, then its entries' devices and the
  // GPUs that hold an entry, ascending (a mirror's are its template's).
  ParallelFor(agents_.size(), Threads(), [&](uint64_t a) {
    if (IsMirror(a)) return;
    int32_t max_gpu = -1;
    for (const TensorEntry& t : agents_[a].tensors) max_gpu = std::max(max_gpu, t.gpu);
    dev_count[a] = max_gpu + 2;
  });
  for (size_t a = 0; a < agents_.size(); ++a) {
    if (IsMirror(a)) dev_count[a] = dev_count[HolderIndex(a)];
    dev_base_[a + 1] = dev_base_[a] + dev_count[a];
  }
  std::vector<std::vector<int32_t>> agent_gpus(agents_.size());
  ParallelFor(agents_.size(), Threads(), [&](uint64_t a) {
    if (IsMirror(a)) return;  // Dev() maps a mirror's entries onto its template's
    tensor_dev_[a].resize(agents_[a].tensors.size());
    std::vector<char> used(dev_count[a], 0);
    for (size_t t = 0; t < agents_[a].tensors.size(); ++t) {
      tensor_dev_[a][t] = dev_base_[a] + agents_[a].tensors[t].gpu + 1;
      used[agents_[a].tensors[t].gpu + 1] = 1;
    }
    for (int32_t d = 1; d < dev_count[a]; ++d) {
      if (used[d]) agent_gpus[a].push_back(d - 1);
    }
  });
  // Rails of a device: its GPU's own NIC(s) by position among the agent's GPUs (GPU i of G
  // uses rails i, i+G, ...; with fewer NICs than GPUs, rail i mod N); host memory any rail.
  dev_rail_first_.assign(dev_base_.back(), 0);
  dev_rail_step_.assign(dev_base_.back(), 1);
  dev_rail_count_.assign(dev_base_.back(), 1);
  rail_base_.assign(agents_.size() + 1, 0);
  rate_scale_.assign(agents_.size(), 1.0);
  for (size_t a = 0; a < agents_.size(); ++a) {
    auto it = options_.cost.agent_rate_scale.find(agents_[a].name);
    if (it != options_.cost.agent_rate_scale.end() && it->second > 0 && it->second < 1) {
      rate_scale_[a] = it->second;
    }
  }
  for (size_t a = 0; a < agents_.size(); ++a) {
    const int nics = std::max<int>(1, agents_[a].nics.size());
    rail_base_[a + 1] = rail_base_[a] + nics;
    // The agent's GPUs, ascending: its device slots that hold an entry.
    const std::vector<int32_t>& gpus = agent_gpus[HolderIndex(static_cast<int32_t>(a))];
    const int g = static_cast<int>(gpus.size());
    dev_rail_count_[dev_base_[a]] = nics;  // host memory
    for (int pos = 0; pos < g; ++pos) {
      const int32_t d = dev_base_[a] + gpus[pos] + 1;
      if (nics >= g) {
        dev_rail_first_[d] = pos, dev_rail_step_[d] = g,
        dev_rail_count_[d] = (nics - pos + g - 1) / g;
      } else {
        dev_rail_first_[d] = pos % nics;
      }
    }
  }
}

double Planner::RailGbps(int32_t agent, int rail) const {
  const auto& nics = agents_[agent].nics;
  const double rated = rail < static_cast<int>(nics.size()) && nics[rail].gbps > 0
                           ? nics[rail].gbps
                           : options_.cost.nic_gbps;
  return rated * rate_scale_[agent];
}

double Planner::OpCost(const PlannedOp& op) const {
  return (static_cast<double>(op.DstBytes()) +
          options_.cost.op_overhead_us * 1e-6 * options_.cost.nic_gbps * 1e9) *
         Fanout(op);
}

// A fan-out op is sent once per destination by one holder. One that fans out to every GPU of a
// large deployment (a tensor the engine replicates: DeepSeek-V3's q_a_proj to 256 GPUs is
// 5.6 GB of sends) can alone outweigh a holder's fair share of the step, and no choice of
// holder balances that: its destinations are cut into several ops, each sent by the holder
// ChooseSources picks for it. Every destination still receives the bytes once, at the same
// offsets; only ops above 1/kSplitsPerShare of a fair share are cut, so plans of many small
// fan-out ops keep their size.
void Planner::SplitHeavyFanouts(const std::vector<double>& fixed_load) {
  constexpr double kSplitsPerShare = 8;
  std::vector<char> source_dev(fixed_load.size(), 0);
  double total = 0;
  for (size_t d = 0; d < fixed_load.size(); ++d) {
    source_dev[d] = fixed_load[d] > 0;
    total += fixed_load[d];
  }
  for (const PendingChoice& p : pending_) {
    total += OpCost(p.op);
    const Slice& s = slices_[p.slice];
    for (int32_t h = 0; h < s.holder_count; ++h) {
      const EntryRef c = holders_[s.holder_begin + h];
      source_dev[tensor_dev_[c.agent][c.tensor]] = 1;
    }
  }
  const int64_t devices = std::count(source_dev.begin(), source_dev.end(), 1);
  if (devices == 0 || total <= 0) return;
  const double cap = total / devices / kSplitsPerShare;
  std::vector<PendingChoice> parts_out;
  for (PendingChoice& p : pending_) {
    if (p.op.fanout < 0) continue;
    const double cost = OpCost(p.op);
    if (cost <= cap) continue;
    const Slice& s = slices_[p.slice];
    const TensorEntry& first = E(holders_[s.holder_begin]);
    int64_t alternatives = 0;
    for (int32_t h = 0; h < s.holder_count; ++h) {
      alternatives += SamePlace(E(holders_[s.holder_begin + h]).view, first.view);
    }
    // The destinations as executed (a mirrored group's mirrors expanded), so that a plan of
    // folded layouts cuts the same parts as the unfolded one (same ops, same hash).
    std::vector<Destination> executed;
    ForEachDestination(plan_, p.op.fanout, [&](const Destination& d) { executed.push_back(d); });
    const int64_t n = static_cast<int64_t>(executed.size());
    const int64_t parts =
        std::min<int64_t>({alternatives, n, static_cast<int64_t>(std::ceil(cost / cap))});
    if (parts < 2) continue;
    for (int64_t k = 0; k < parts; ++k) {
      const int64_t b = n * k / parts, e = n * (k + 1) / parts;
      // The part's first destination is its op's dst_*, with a src_shift of 0: the op's
      // src_offset moves by that shift, the others' shifts by minus it (same executed offsets).
      const Destination lead = executed[b];
      for (int64_t i = b; i < e; ++i) {
        Destination d = executed[i];
        d.src_shift -= lead.src_shift;
        plan_.fanout_dsts.push_back(d);
      }
      plan_.fanout_begin.push_back(static_cast<uint32_t>(plan_.fanout_dsts.size()));
      plan_.fanout_mirrored.push_back(0);
      plan_.fanout_size.push_back(static_cast<uint32_t>(e - b));
      PendingChoice part = p;
      part.op.fanout = static_cast<int32_t>(plan_.fanout_size.size() - 1);
      part.op.dst_agent = lead.agent;
      part.op.dst_tensor = lead.tensor;
      part.op.scale_tensor = lead.scale_tensor;
      part.op.src_offset = p.op.src_offset + lead.src_shift;
      parts_out.push_back(part);
    }
    p.op.fanout = -2;  // replaced by its parts; the group it listed is left unused
  }
  if (parts_out.empty()) return;
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [](const PendingChoice& p) { return p.op.fanout == -2; }),
                 pending_.end());
  pending_.insert(pending_.end(), parts_out.begin(), parts_out.end());
}

void Planner::ChooseSources() {
  if (pending_.empty()) return;
  std::vector<double> load(dev_base_.back(), 0.0);
  for (const auto& ops : plan_.ops) {
    for (const PlannedOp& op : ops) load[tensor_dev_[op.src_agent][op.src_tensor]] += OpCost(op);
  }
  SplitHeavyFanouts(load);
  // Load in time, not bytes, where a link was measured slow: its device's bytes count 1/f times
  // (without measurements every weight is exactly 1 and the choice is the one by bytes).
  std::vector<double> weight(load.size(), 1.0);
  for (size_t a = 0; a < agents_.size(); ++a) {
    for (int32_t d = dev_base_[a]; d < dev_base_[a + 1]; ++d) weight[d] = 1.0 / rate_scale_[a];
  }
  for (size_t d = 0; d < load.size(); ++d) load[d] *= weight[d];
  // Largest first; ties in generation order. Sorting (bytes, index) pairs keeps it cheap.
  std::vector<std::pair<uint64_t, uint32_t>> order(pending_.size());
  for (size_t i = 0; i < pending_.size(); ++i) {
    order[i] = {~(pending_[i].op.DstBytes() * Fanout(pending_[i].op)), static_cast<uint32_t>(i)};
  }
  std::sort(order.begin(), order.end());
  for (const auto& [key, i] : order) {
    PlannedOp& op = pending_[i].op;
    const Slice& s = slices_[pending_[i].slice];
    EntryRef best = holders_[s.holder_begin];
    const TensorEntry& first = E(best);
    double best_load = load[tensor_dev_[best.agent][best.tensor]];
    for (int32_t h = 1; h < s.holder_count; ++h) {
      EntryRef c = holders_[s.holder_begin + h];
      // The op's source offsets are the first holder's: a holder whose view places the slice
      // elsewhere in its buffer is no alternative.
      if (!SamePlace(E(c).view, first.view)) continue;
      double l = load[tensor_dev_[c.agent][c.tensor]];
      if (l < best_load) best = c, best_load = l;
    }
    op.src_agent = best.agent;
    op.src_tensor = best.tensor;
    const int32_t dev = tensor_dev_[best.agent][best.tensor];
    load[dev] += OpCost(op) * weight[dev];
  }
  // Appended in generation order, so each sender's list stays in a canonical order.
  std::vector<size_t> extra(agents_.size(), 0);
  for (const PendingChoice& p : pending_) ++extra[p.op.src_agent];
  for (size_t a = 0; a < agents_.size(); ++a) plan_.ops[a].reserve(plan_.ops[a].size() + extra[a]);
  needs_order_.assign(agents_.size(), 0);
  for (const PendingChoice& p : pending_) {
    plan_.ops[p.op.src_agent].push_back(p.op);
    needs_order_[p.op.src_agent] = 1;
  }
  pending_.clear();
  pending_.shrink_to_fit();
}

void Planner::OrderOps() {
  const int32_t na = static_cast<int32_t>(agents_.size());
  const int32_t phases = phases_;
  plan_.phases = phases;
  std::vector<uint64_t> key_count;
  OpList sorted;
  for (int32_t a = 0; a < na; ++a) {
    OpList& ops = plan_.ops[a];
    // Directly placed ops are in order already; only balanced (appended) ones need sorting.
    if (ops.empty() || a >= static_cast<int32_t>(needs_order_.size()) || !needs_order_[a]) {
      continue;
    }
    auto key = [&](const PlannedOp& op) {
      int32_t rot = (agent_rank_[op.dst_agent] - agent_rank_[a] + na) % na;
      return static_cast<size_t>(op.phase) * na + rot;
    };
    key_count.assign(static_cast<size_t>(phases) * na + 1, 0);
    for (const PlannedOp& op : ops) ++key_count[key(op) + 1];
    for (size_t k = 1; k < key_count.size(); ++k) key_count[k] += key_count[k - 1];
    // Sort through one scratch buffer reused by every sender (cache-warm, no page faults).
    if (sorted.size() < ops.size()) sorted.resize(ops.size());
    for (const PlannedOp& op : ops) sorted[key_count[key(op)]++] = op;
    std::copy(sorted.begin(), sorted.begin() + ops.size(), ops.begin());
  }
}

double Planner::Imbalance(const std::vector<uint64_t>& v) {
  if (v.empty()) return 0;
  double sum = 0, mx = 0;
  for (uint64_t x : v) sum += x, mx = std::max<double>(mx, x);
  return sum > 0 ? mx / (sum / v.size()) : 0;
}

void Planner::Finish() {
  PlanStats& s = plan_.stats;
  const size_t na = agents_.size();
  s.send_bytes.assign(na, 0);
  s.send_ops.assign(na, 0);
  s.recv_bytes.assign(na, 0);
  s.recv_ops.assign(na, 0);
  s.is_sender.assign(na, false);
  s.is_receiver.assign(na, false);
  const size_t nd = dev_base_.back();
  std::vector<uint64_t> dev_send(nd, 0), dev_recv(nd, 0);
  std::vector<char> dev_src(nd, 0), dev_dst(nd, 0);
  std::vector<double> send_rail(rail_base_.back(), 0), recv_rail(rail_base_.back(), 0);
  std::vector<uint64_t> send_rail_ops(rail_base_.back(), 0);

  std::vector<uint64_t> name_hash(names_.size());
  for (size_t n = 0; n < names_.size(); ++n) name_hash[n] = HashString(names_[n]);
  // An entry's identity in the hash: name, region, replica, rank (never input positions).
  // Linear in region and replica, so a mirror's entry hash follows from its template's with
  // two multiply-adds (Kimi-K2 TP 8 hashes 14 M executed destinations, most of them mirrors').
  constexpr uint64_t kRegionK = 0x9e3779b97f4a7c15ULL, kReplicaK = 0xc2b2ae3d27d4eb4fULL;
  auto entry_hash = [&](int32_t name, uint64_t region, int32_t replica, int32_t rank) {
    return Mix(name < 0 ? 0 : name_hash[name], static_cast<uint64_t>(rank)) + region * kRegionK +
           static_cast<uint64_t>(int64_t{replica}) * kReplicaK;
  };
  std::vector<uint64_t> agent_hash(na);
  std::vector<std::vector<uint64_t>> tensor_hash(na);
  // One agent per unit on every thread: each writes only its own entries and devices (its
  // sides go to plain vectors first: vector<bool> bits of neighbours share a word).
  std::vector<char> sends(na, 0), receives(na, 0);
  ParallelFor(na, Threads(), [&](uint64_t a) {
    agent_hash[a] = HashString(agents_[a].name);
    if (IsMirror(a)) return;  // hashed on use (tensor_hash_of)
    tensor_hash[a].resize(agents_[a].tensors.size());
    for (size_t t = 0; t < agents_[a].tensors.size(); ++t) {
      const TensorEntry& e = agents_[a].tensors[t];
      bool src = e.owner.role == Role::kTrainer;
      (src ? sends : receives)[a] = 1;
      (src ? dev_src : dev_dst)[tensor_dev_[a][t]] = 1;
      tensor_hash[a][t] = entry_hash(tensor_name_[a][t], e.region, e.owner.replica, e.owner.rank);
    }
  });
  for (size_t a = 0; a < na; ++a) {
    s.is_sender[a] = sends[a] != 0;
    s.is_receiver[a] = receives[a] != 0;
  }
  // A mirror: its template's sides and devices; its entries' hashes with its own regions and
  // replicas, as the unfolded entries would have.
  for (size_t a = 0; a < na; ++a) {
    if (!IsMirror(a)) continue;
    const int32_t of = HolderIndex(a);
    s.is_receiver[a] = s.is_receiver[of];
    for (int32_t d = 0; d < dev_base_[of + 1] - dev_base_[of]; ++d) {
      dev_dst[dev_base_[a] + d] = dev_dst[dev_base_[of] + d];
    }
  }
  auto tensor_hash_of = [&](int32_t a, int32_t t) -> uint64_t {
    if (!IsMirror(a)) return tensor_hash[a][t];
    const int32_t of = HolderIndex(a);
    const uint64_t region_shift = EntryRegion(agents_, a, t) - agents_[of].tensors[t].region;
    return tensor_hash[of][t] + region_shift * kRegionK +
           static_cast<uint64_t>(int64_t{delta_[a]}) * kReplicaK;
  };
  // Fan-out groups: a hash over their destinations; bytes and ops they receive, per group,
  // handed to each member after the pass over the ops.
  const size_t ngroups = plan_.fanout_begin.empty() ? 0 : plan_.fanout_begin.size() - 1;
  std::vector<uint64_t> group_hash(ngroups, 0), group_bytes(ngroups, 0), group_ops(ngroups, 0);
  // Groups are independent: hashed in blocks on every thread (Kimi-K2 TP 8: 14 M members).
  constexpr size_t kGroupsPerUnit = 4096;
  ParallelFor((ngroups + kGroupsPerUnit - 1) / kGroupsPerUnit, Threads(), [&](uint64_t unit) {
    const size_t end = std::min(ngroups, (unit + 1) * kGroupsPerUnit);
    for (size_t g = unit * kGroupsPerUnit; g < end; ++g) {
      uint64_t gh = Mix(0, plan_.fanout_size[g]);
      ForEachDestination(plan_, g, [&](const Destination& d) {
        uint64_t w = agent_hash[d.agent];
        w = w * kPrime + tensor_hash_of(d.agent, d.tensor);
        w = w * kPrime + (d.scale_tensor >= 0 ? tensor_hash_of(d.agent, d.scale_tensor) : 0);
        w = w * kPrime + static_cast<uint64_t>(int64_t{d.src_shift});
        gh = Mix(gh, w);
      });
      group_hash[g] = gh;
    }
  });
  // The pass over the ops runs on every thread, senders in contiguous chunks of about equal
  // op counts: a sender's rails, bytes and hash chain are its own; what receivers get is summed
  // per chunk (integers: the same totals for any chunking) and fan-out groups' bytes atomically.
  struct Received {
    std::vector<uint64_t> bytes, ops, dev;
  };
  const int threads = Threads();
  std::vector<uint64_t> work(na);
  for (size_t i = 0; i < na; ++i) work[i] = plan_.ops[plan_.agent_order[i]].size() + 1;
  const auto chunks = SplitByWork(work, threads);
  std::vector<Received> received(chunks.size());
  for (Received& r : received) r.bytes.assign(na, 0), r.ops.assign(na, 0), r.dev.assign(nd, 0);
  std::vector<uint64_t> chain(na);
  auto receive = [&](Received* r, int32_t agent, int32_t tensor, uint64_t bytes, uint64_t ops) {
    r->bytes[agent] += bytes;
    r->ops[agent] += ops;
    r->dev[Dev(agent, tensor)] += bytes;
  };
  ParallelFor(chunks.size(), threads, [&](uint64_t c) {
    Received* r = &received[c];
    for (size_t i = chunks[c].first; i < chunks[c].second; ++i) {
      const int32_t a = plan_.agent_order[i];
      uint64_t h = Mix(agent_hash[a], plan_.ops[a].size());
      const int32_t rb = rail_base_[a];
      for (PlannedOp& op : plan_.ops[a]) {
        const uint64_t b = op.DstBytes();
        const uint64_t fan = Fanout(op);
        const int32_t sd = tensor_dev_[a][op.src_tensor];
        int best = dev_rail_first_[sd];
        for (int k = 1; k < dev_rail_count_[sd]; ++k) {
          int rail = dev_rail_first_[sd] + k * dev_rail_step_[sd];
          if (send_rail[rb + rail] < send_rail[rb + best]) best = rail;
        }
        op.rail = static_cast<int16_t>(best);
        send_rail[rb + best] += b * fan;
        send_rail_ops[rb + best] += fan;
        if (op.fanout < 0) {
          receive(r, op.dst_agent, op.dst_tensor, b, 1);
        } else {
          __atomic_fetch_add(&group_bytes[op.fanout], b, __ATOMIC_RELAXED);
          __atomic_fetch_add(&group_ops[op.fanout], uint64_t{1}, __ATOMIC_RELAXED);
        }
        s.send_bytes[a] += b * fan;
        s.send_ops[a] += fan;
        dev_send[sd] += b * fan;

        // Word-wise polynomial over the op's fields, mixed once per op. A fan-out op hashes its
        // group's destinations instead of its first one.
        uint64_t w = tensor_hash[a][op.src_tensor];
        if (op.fanout < 0) {
          w = w * kPrime + agent_hash[op.dst_agent];
          w = w * kPrime + tensor_hash_of(op.dst_agent, op.dst_tensor);
          w = w * kPrime +
              (op.scale_tensor >= 0 ? tensor_hash_of(op.dst_agent, op.scale_tensor) : 0);
        } else {
          w = w * kPrime + group_hash[op.fanout];
        }
        w = w * kPrime + op.src_offset;
        w = w * kPrime + op.src_stride;
        w = w * kPrime + op.dst_offset;
        w = w * kPrime + op.dst_stride;
        w = w * kPrime + op.rows;
        w = w * kPrime + op.row_elems;
        w = w * kPrime + op.scale_offset;
        w = w * kPrime + ((uint64_t{op.scale_stride} << 32) ^ (uint64_t{op.src_dtype} << 24) ^
                          (uint64_t{op.dst_dtype} << 16) ^ (uint64_t{op.transform} << 8));
        w = w * kPrime + ((uint64_t(uint16_t(op.rail)) << 16) | uint64_t(uint16_t(op.phase)));
        h = Mix(h, w);
      }
      chain[a] = h;
    }
  });
  uint64_t h = Mix(0, plan_.phases);
  for (int32_t a : plan_.agent_order) {
    h = Mix(h, chain[a]);
    s.total_bytes += s.send_bytes[a];
    s.total_ops += s.send_ops[a];
    s.plan_ops += plan_.ops[a].size();
  }
  // Fan-out groups hand their bytes to every member, in blocks on every thread.
  const size_t group_units = (ngroups + kGroupsPerUnit - 1) / kGroupsPerUnit;
  const auto group_chunks = SplitByWork(std::vector<uint64_t>(group_units, 1), threads);
  std::vector<Received> group_received(group_chunks.size());
  for (Received& r : group_received) {
    r.bytes.assign(na, 0), r.ops.assign(na, 0), r.dev.assign(nd, 0);
  }
  ParallelFor(group_chunks.size(), threads, [&](uint64_t c) {
    const size_t begin = group_chunks[c].first * kGroupsPerUnit;
    const size_t end = std::min(ngroups, group_chunks[c].second * kGroupsPerUnit);
    for (size_t g = begin; g < end; ++g) {
      if (group_ops[g] == 0) continue;
      ForEachDestination(plan_, static_cast<int32_t>(g), [&](const Destination& d) {
        receive(&group_received[c], d.agent, d.tensor, group_bytes[g], group_ops[g]);
      });
    }
  });
  received.insert(received.end(), group_received.begin(), group_received.end());
  for (const Received& r : received) {
    for (size_t a = 0; a < na; ++a) s.recv_bytes[a] += r.bytes[a], s.recv_ops[a] += r.ops[a];
    for (size_t d = 0; d < nd; ++d) dev_recv[d] += r.dev[d];
  }
  // A device's received bytes are shared equally by its rails.
  for (size_t a = 0; a < na; ++a) {
    for (int32_t dd = dev_base_[a]; dd < dev_base_[a + 1]; ++dd) {
      const double share = static_cast<double>(dev_recv[dd]) / dev_rail_count_[dd];
      for (int k = 0; k < dev_rail_count_[dd]; ++k) {
        recv_rail[rail_base_[a] + dev_rail_first_[dd] + k * dev_rail_step_[dd]] += share;
      }
    }
  }
  plan_.hash = h;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  plan_.hash_hex = buf;

  std::vector<uint64_t> senders, receivers;
  for (size_t a = 0; a < na; ++a) {
    if (s.is_sender[a]) senders.push_back(s.send_bytes[a]);
    if (s.is_receiver[a]) receivers.push_back(s.recv_bytes[a]);
  }
  for (size_t d = 0; d < nd; ++d) {
    if (dev_src[d]) s.sender_device_bytes.push_back(dev_send[d]);
    if (dev_dst[d]) s.receiver_device_bytes.push_back(dev_recv[d]);
  }
  s.sender_imbalance = Imbalance(senders);
  s.receiver_imbalance = Imbalance(receivers);
  s.sender_device_imbalance = Imbalance(s.sender_device_bytes);
  s.device_send_bytes = dev_send;
  s.agent_device_base = dev_base_;
  double step = 0;
  for (size_t a = 0; a < na; ++a) {
    for (int r = 0; r < rail_base_[a + 1] - rail_base_[a]; ++r) {
      const double gbps = RailGbps(a, r) * 1e9;
      const double send = send_rail[rail_base_[a] + r] / gbps +
                          send_rail_ops[rail_base_[a] + r] * options_.cost.op_overhead_us * 1e-6;
      const double recv = recv_rail[rail_base_[a] + r] / gbps;
      recv_limit_seconds_ = std::max(recv_limit_seconds_, recv);
      step = std::max({step, send, recv});
      s.link_limit_seconds =
          std::max({s.link_limit_seconds, send_rail[rail_base_[a] + r] / gbps, recv});
    }
  }
  s.predicted_step_seconds = step;
  recv_rail_ = std::move(recv_rail);
}

}  // namespace internal

}  // namespace wb::planner
