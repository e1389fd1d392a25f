#include "common/planner/plan_proto.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/planner/relay.h"

namespace wb::planner {

namespace v1 = weightbeam::v1;

absl::StatusOr<AgentLayout> LayoutFromProto(const v1::AgentInfo& info,
                                            const v1::AgentLayout& layout) {
  if (!info.name().empty() && info.name() != layout.agent()) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent info names ", info.name(), " but its layout names ", layout.agent()));
  }
  AgentLayout out;
  out.name = layout.agent();
  for (const v1::NicInfo& n : info.nics()) out.nics.push_back(Nic{n.name(), n.gbps()});
  out.tensors.reserve(layout.tensors_size());
  for (const v1::TensorLayout& t : layout.tensors()) {
    TensorEntry e;
    e.name = t.spec().name();
    e.dtype = t.spec().dtype();
    e.shape.assign(t.spec().global_shape().begin(), t.spec().global_shape().end());
    for (const v1::DimSlice& s : t.spec().shard()) e.shard.push_back(DimSlice{s.start(), s.size()});
    if (t.spec().has_view()) {
      const v1::BufferView& v = t.spec().view();
      e.view.shape.assign(v.shape().begin(), v.shape().end());
      e.view.offset.assign(v.offset().begin(), v.offset().end());
      e.view.buffer = v.buffer();
    }
    switch (t.owner().role()) {
      case v1::ROLE_TRAINER:
        e.owner.role = Role::kTrainer;
        break;
      case v1::ROLE_INFERENCE:
        e.owner.role = Role::kInference;
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "agent ", layout.agent(), " tensor ", e.name.str(), ": owner role is unspecified"));
    }
    e.owner.rank = t.owner().rank();
    e.owner.replica = t.owner().replica();
    e.region = t.region().region_id();
    e.region_bytes = t.region().length();
    if (!ParseLocation(t.location(), &e.gpu)) {
      return absl::InvalidArgumentError(absl::StrCat("agent ", layout.agent(), " tensor ",
                                                     e.name.str(), ": location \"", t.location(),
                                                     "\" is neither host nor cuda:N"));
    }
    out.tensors.push_back(std::move(e));
  }
  // Canonical order: by owner (role, replica, rank), each owner's tensors in the order it
  // registered them. An agent lists tensors in registration order, and the worker processes of
  // one node register at the same time, interleaved differently on every node: agents that hold
  // alike layouts for different replicas would then not be recognized as mirrors (FoldMirrors),
  // nor relay to each other.
  auto before = [](const TensorEntry& a, const TensorEntry& b) {
    return std::make_tuple(a.owner.role, a.owner.replica, a.owner.rank) <
           std::make_tuple(b.owner.role, b.owner.replica, b.owner.rank);
  };
  if (!std::is_sorted(out.tensors.begin(), out.tensors.end(), before)) {
    std::stable_sort(out.tensors.begin(), out.tensors.end(), before);
  }
  return out;
}

void LayoutToProto(const AgentLayout& in, v1::AgentInfo* info, v1::AgentLayout* layout) {
  info->set_name(in.name);
  for (const Nic& n : in.nics) {
    v1::NicInfo* p = info->add_nics();
    p->set_name(n.name);
    p->set_gbps(n.gbps);
  }
  layout->set_agent(in.name);
  for (const TensorEntry& e : in.tensors) {
    v1::TensorLayout* t = layout->add_tensors();
    t->mutable_spec()->set_name(e.name);
    t->mutable_spec()->set_dtype(e.dtype);
    for (int64_t d : e.shape) t->mutable_spec()->add_global_shape(d);
    for (const DimSlice& s : e.shard) {
      v1::DimSlice* p = t->mutable_spec()->add_shard();
      p->set_start(s.start);
      p->set_size(s.size);
    }
    if (!e.view.empty()) {
      v1::BufferView* v = t->mutable_spec()->mutable_view();
      for (int64_t d : e.view.shape) v->add_shape(d);
      for (int64_t o : e.view.offset) v->add_offset(o);
      v->set_buffer(e.view.buffer);
    }
    t->mutable_owner()->set_role(e.owner.role == Role::kTrainer ? v1::ROLE_TRAINER
                                                                : v1::ROLE_INFERENCE);
    t->mutable_owner()->set_rank(e.owner.rank);
    t->mutable_owner()->set_replica(e.owner.replica);
    t->mutable_region()->set_region_id(e.region);
    t->mutable_region()->set_length(e.region_bytes);
    t->set_location(FormatLocation(e.gpu));
  }
}

v1::TransferOp OpToProto(const std::vector<AgentLayout>& agents, const PlannedOp& op,
                         uint64_t op_id) {
  const TensorEntry& src = EntryHolder(agents, op.src_agent).tensors[op.src_tensor];
  const AgentLayout& dst_agent = agents[op.dst_agent];
  const TensorEntry& dst = EntryHolder(agents, op.dst_agent).tensors[op.dst_tensor];
  v1::TransferOp p;
  p.set_op_id(op_id);
  p.set_dst_agent(dst_agent.name);
  p.set_src_tensor(src.name);
  p.set_dst_tensor(dst.name);
  p.set_src_region(EntryRegion(agents, op.src_agent, op.src_tensor));
  p.set_src_offset(op.src_offset);
  p.set_src_stride(op.src_stride);
  p.set_dst_region(EntryRegion(agents, op.dst_agent, op.dst_tensor));
  p.set_dst_offset(op.dst_offset);
  p.set_dst_stride(op.dst_stride);
  p.set_rows(op.rows);
  p.set_row_elems(op.row_elems);
  p.set_src_dtype(op.SrcDType());
  p.set_dst_dtype(op.DstDType());
  p.set_transform(op.GetTransform());
  if (op.scale_tensor >= 0) {
    p.set_scale_region(EntryRegion(agents, op.dst_agent, op.scale_tensor));
    p.set_scale_offset(op.scale_offset);
    p.set_scale_stride(op.scale_stride);
  }
  p.set_phase(op.phase);
  p.set_rail(op.rail);
  p.set_dst_bytes(op.DstBytes());
  if (op.relay) p.set_relay(true);
  return p;
}

std::vector<v1::AgentPlan> PlanToProto(const std::vector<AgentLayout>& agents, const Plan& plan,
                                       uint64_t plan_id) {
  std::vector<v1::AgentPlan> out;
  // With relays (relay.h): senders send to the roots only, and each relay forwards what
  // landed in it to its children, in the plan's last phase (after anything it sends itself).
  const bool relays = plan.relay.roots > 0;
  std::vector<OpList> relay_ops;
  if (relays) relay_ops = AllRelayOps(agents, plan);
  const int16_t relay_phase = static_cast<int16_t>(std::max(plan.phases, 1) - 1);
  for (int32_t a : plan.agent_order) {
    const OpList& ops = plan.ops[a];
    const bool forwards = relays && !relay_ops[a].empty();
    if (ops.empty() && !forwards) continue;
    v1::AgentPlan p;
    p.set_agent(agents[a].name);
    p.set_plan_id(plan_id);
    p.set_phases(plan.phases);
    // Per receiving agent (by index), the (region, length) pairs written; sorted and made
    // unique below (10^6 ops would cost a tree insert each).
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> regions(agents.size());
    // One TransferOp per executed op: a fan-out op becomes one per destination.
    uint64_t i = 0;
    p.mutable_ops()->Reserve(
        static_cast<int>(std::min<uint64_t>(plan.stats.send_ops[a], INT32_MAX)));
    auto add = [&](const PlannedOp& op) {
      *p.add_ops() = OpToProto(agents, op, i++);
      const AgentLayout& d = EntryHolder(agents, op.dst_agent);
      auto& r = regions[op.dst_agent];
      r.emplace_back(EntryRegion(agents, op.dst_agent, op.dst_tensor),
                     d.tensors[op.dst_tensor].region_bytes);
      if (op.scale_tensor >= 0) {
        r.emplace_back(EntryRegion(agents, op.dst_agent, op.scale_tensor),
                       d.tensors[op.scale_tensor].region_bytes);
      }
    };
    if (relays) {
      ForEachSentOp(plan, a, add);
      if (plan.relay.direct_fallback) {
        ForEachExecutedOp(plan, a, [&](const PlannedOp& op) {
          if (!IsRelayed(plan, op.dst_agent)) return;
          add(op);
          p.mutable_ops(p.ops_size() - 1)->set_fallback(true);
        });
      }
      if (forwards) {
        for (PlannedOp op : relay_ops[a]) {
          op.phase = relay_phase;
          add(op);
        }
        OpList().swap(relay_ops[a]);
      }
    } else {
      ForEachExecutedOp(plan, a, add);
    }
    // Peers in name order (agent_order), each region once, by id.
    for (int32_t b : plan.agent_order) {
      auto& r = regions[b];
      if (r.empty()) continue;
      std::sort(r.begin(), r.end());
      r.erase(std::unique(r.begin(), r.end(),
                          [](const auto& x, const auto& y) { return x.first == y.first; }),
              r.end());
      v1::PeerIntro* peer = p.add_peers();
      peer->set_agent(agents[b].name);
      for (const auto& [id, length] : r) {
        v1::RegionDescriptor* d = peer->add_regions();
        d->set_region_id(id);
        d->set_length(length);
      }
      std::vector<std::pair<uint64_t, uint64_t>>().swap(r);
    }
    out.push_back(std::move(p));
  }
  return out;
}

v1::PlanSummary SummaryToProto(const std::vector<AgentLayout>& agents, const Plan& plan,
                               uint64_t plan_id) {
  const PlanStats& s = plan.stats;
  v1::PlanSummary p;
  p.set_plan_id(plan_id);
  p.set_plan_hash(plan.hash_hex);
  p.set_total_bytes(s.total_bytes);
  p.set_total_ops(s.total_ops);
  for (int32_t a : plan.agent_order) {
    if (s.is_sender[a]) {
      v1::PeerBytes* b = p.add_senders();
      b->set_agent(agents[a].name);
      b->set_bytes(s.send_bytes[a]);
      b->set_ops(s.send_ops[a]);
    }
    if (s.is_receiver[a]) {
      v1::PeerBytes* b = p.add_receivers();
      b->set_agent(agents[a].name);
      b->set_bytes(s.recv_bytes[a]);
      b->set_ops(s.recv_ops[a]);
    }
  }
  p.set_sender_imbalance(s.sender_imbalance);
  p.set_receiver_imbalance(s.receiver_imbalance);
  p.set_predicted_step_seconds(s.predicted_step_seconds);
  p.set_link_limit_seconds(s.link_limit_seconds);
  const RelayTree& r = plan.relay;
  p.set_receiver_limit_seconds(r.receiver_limit_seconds);
  p.set_predicted_without_relays_seconds(r.direct_predicted_seconds);
  if (r.roots > 0) {
    p.set_relay_roots(r.roots);
    p.set_relay_fanout(r.fanout);
    p.set_relay_depth(r.depth);
    p.set_relayed_bytes(r.relayed_bytes);
    for (int32_t a : plan.agent_order) {
      if (r.relay_send_bytes[a] == 0) continue;
      v1::PeerBytes* b = p.add_relays();
      b->set_agent(agents[a].name);
      b->set_bytes(r.relay_send_bytes[a]);
      b->set_ops(r.relay_send_ops[a]);
    }
  }
  p.set_phases(plan.phases);
  return p;
}

}  // namespace wb::planner
