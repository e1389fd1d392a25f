#include "daemon/delta/delta_sender.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/delta/delta_codec.h"

namespace wb::delta {

namespace v1 = weightbeam::v1;

DeltaSender::DeltaSender(const v1::AgentPlan& plan, int big_op_threads, ShadowPlacement gpu_shadow)
    : big_op_threads_(std::max(1, big_op_threads)), gpu_shadow_(gpu_shadow) {
  for (const auto& op : plan.ops()) {
    auto st = std::make_unique<OpState>();
    st->layout = LayoutOf(op);
    ops_[op.op_id()] = std::move(st);
  }
  for (const auto& slot : plan.delta_slots()) {
    auto it = ops_.find(slot.op_id());
    if (it == ops_.end()) continue;
    it->second->has_slot = true;
    it->second->slot = slot;
  }
}

const OpLayout* DeltaSender::Layout(uint64_t op_id) const {
  auto it = ops_.find(op_id);
  return it == ops_.end() ? nullptr : &it->second->layout;
}

uint64_t DeltaSender::shadow_bytes() const {
  uint64_t n = 0;
  for (const auto& [id, st] : ops_) n += st->shadow.size();
  return n;
}

absl::StatusOr<OpOutcome> DeltaSender::Process(const v1::TransferOp& op, uint8_t* flat,
                                               const StepDelta& step) {
  auto it = ops_.find(op.op_id());
  if (it == ops_.end()) {
    return absl::InternalError(absl::StrCat("op ", op.op_id(), " is not in the delta state"));
  }
  OpState& st = *it->second;
  const OpLayout& l = st.layout;
  // Padding between FP8 data and scales is never written anywhere: keep it zero so it never
  // shows up as a change.
  if (l.segments.size() > 1 && l.segments.back().scales) {
    uint64_t data_end = 0;
    for (const Segment& s : l.segments) {
      if (!s.scales) data_end = s.flat_offset + s.length;
    }
    uint64_t scale_begin = l.flat_bytes;
    for (const Segment& s : l.segments) {
      if (s.scales) {
        scale_begin = s.flat_offset;
        break;
      }
    }
    if (scale_begin > data_end) std::memset(flat + data_end, 0, scale_begin - data_end);
  }
  std::vector<uint8_t> packed;
  auto out = Encode(op, st, flat, step, &packed);
  if (!out.ok() || !out->packed) return out;
  // The shadow already equals `flat`: its bytes are free to carry the slot write.
  WriteSlotHeader({kSlotMagic, step.version, step.nonce, op.op_id(), packed.size()}, flat);
  std::memcpy(flat + kSlotHeaderBytes, packed.data(), packed.size());
  return out;
}

absl::StatusOr<OpOutcome> DeltaSender::ProcessInPlace(const v1::TransferOp& op, const uint8_t* flat,
                                                      const StepDelta& step,
                                                      std::vector<uint8_t>* slot_bytes) {
  auto it = ops_.find(op.op_id());
  if (it == ops_.end()) {
    return absl::InternalError(absl::StrCat("op ", op.op_id(), " is not in the delta state"));
  }
  std::vector<uint8_t> packed;
  auto out = Encode(op, *it->second, flat, step, &packed);
  if (!out.ok() || !out->packed) return out;
  WriteSlot(op, step, packed, slot_bytes);
  return out;
}

void DeltaSender::WriteSlot(const v1::TransferOp& op, const StepDelta& step,
                            const std::vector<uint8_t>& packed, std::vector<uint8_t>* slot_bytes) {
  slot_bytes->resize(kSlotHeaderBytes + packed.size());
  WriteSlotHeader({kSlotMagic, step.version, step.nonce, op.op_id(), packed.size()},
                  slot_bytes->data());
  std::memcpy(slot_bytes->data() + kSlotHeaderBytes, packed.data(), packed.size());
}

void DeltaSender::Decide(const OpState& st, DeltaEncoding enc, OpOutcome* out,
                         std::vector<uint8_t>* packed) {
  const OpLayout& l = st.layout;
  out->changed_elems = enc.changed_elems;
  if (enc.kind != DeltaEncoding::Kind::kPacked || !st.has_slot) return;
  const uint64_t need = kSlotHeaderBytes + enc.packed.size();
  if (need > st.slot.capacity() || need > l.flat_bytes) return;  // dense is no larger
  *packed = std::move(enc.packed);
  out->packed = true;
  out->write_bytes = need;
  out->slot_region = st.slot.region_id();
  out->slot_offset = st.slot.offset();
}

absl::StatusOr<OpOutcome> DeltaSender::Encode(const v1::TransferOp& op, OpState& st,
                                              const uint8_t* flat, const StepDelta& step,
                                              std::vector<uint8_t>* packed) {
  const OpLayout& l = st.layout;
  OpOutcome out;
  if (step.verify) out.hash = HashFlat(l, flat);
  if (step.anchor || !st.valid) {
    st.shadow.assign(flat, flat + l.flat_bytes);
    st.valid = true;
    out.changed_elems = l.flat_bytes / l.elem_size;  // unknown: counted as all
    return out;
  }
  auto enc = EncodeDelta(absl::MakeSpan(st.shadow), absl::MakeConstSpan(flat, l.flat_bytes),
                         l.elem_size, l.flat_bytes >= (uint64_t{64} << 20) ? big_op_threads_ : 1);
  if (!enc.ok()) {
    st.valid = false;
    return absl::Status(enc.status().code(),
                        absl::StrCat("change detection: ", enc.status().message()));
  }
  Decide(st, std::move(*enc), &out, packed);
  return out;
}

}  // namespace wb::delta
