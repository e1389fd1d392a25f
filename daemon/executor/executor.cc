#include "daemon/executor/executor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tensor/dtype.h"
#include "common/tensor/tensor_checks.h"
#include "daemon/executor/blocking_queue.h"
#include "daemon/executor/gpu_source.h"
#include "daemon/executor/op_bounds.h"
#include "daemon/registry/bus_guard.h"

namespace wb::executor {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

namespace {

// Copies `rows` rows of `row` bytes, `stride` bytes apart from `src`, packed into `dst`.
void GatherRows(const uint8_t* src, uint64_t row, uint64_t stride, uint64_t rows, uint8_t* dst) {
  if (stride == row) {
    std::memcpy(dst, src, row * rows);
    return;
  }
  for (uint64_t r = 0; r < rows; ++r) std::memcpy(dst + r * row, src + r * stride, row);
}

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The tensor and its owner, for errors about its memory.
std::string TensorAndOwner(const registry::RegisteredTensor& t) {
  return absl::StrCat("tensor '", t.spec.name(), "' of ", v1::Role_Name(t.owner.role()), " rank ",
                      t.owner.rank(), " (pid ", t.owner.pid(), ")");
}

absl::Status MemoryVanished(const std::string& op, const registry::RegisteredTensor& t) {
  return absl::FailedPreconditionError(
      absl::StrCat(op, ": ", TensorAndOwner(t),
                   ": its memory went away during the copy (SIGBUS: the shared-memory object "
                   "was shrunk after registration)"));
}

std::string OpName(const v1::TransferOp& op) {
  return absl::StrCat("op ", op.op_id(), " (", op.src_tensor(), " -> ", op.dst_agent(), ":",
                      op.dst_tensor(), ")");
}

// First error wins; later ones are dropped.
class ErrorSlot {
 public:
  void Set(absl::Status s) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = std::move(s);
  }
  absl::Status Get() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  bool failed() const {
    absl::MutexLock lock(&mu_);
    return !status_.ok();
  }

 private:
  mutable absl::Mutex mu_;
  absl::Status status_;
};

}  // namespace

// One operation moving through the pipeline.
struct Executor::Job {
  const v1::TransferOp* op = nullptr;
  std::shared_ptr<const registry::RegisteredTensor> source;
  StagingLease staging;  // empty for zero-copy ops; dropping the job gives it back
  const Route* route = nullptr;
  bool captured = false;     // `source` is a capture's stand-in (capture_store.h)
  uint64_t dense_bytes = 0;  // what a dense write of this op lands
  // Delta mode: the staging buffer holds slot header + packed delta for this slot.
  bool packed = false;
  uint64_t slot_region = 0;
  uint64_t slot_offset = 0;
  uint64_t packed_bytes = 0;
};

Executor::Executor(registry::RegionRegistry* registry, StagingPool* staging,
                   const Preparer* preparer, ExecutorOptions options)
    : registry_(registry), staging_(staging), preparer_(preparer), options_(options) {}

void SortByPhase(OpList* ops) {
  auto by_phase = [](const v1::TransferOp* a, const v1::TransferOp* b) {
    return a->phase() < b->phase();
  };
  // The planner emits each sender's ops phase by phase: most plans need no sort at all.
  if (std::is_sorted(ops->pointer_begin(), ops->pointer_end(), by_phase)) return;
  std::stable_sort(ops->pointer_begin(), ops->pointer_end(), by_phase);
}

void Executor::Load(std::vector<v1::TransferOp> ops, std::map<std::string, Route> routes,
                    std::shared_ptr<delta::DeltaSender> delta) {
  auto list = std::make_shared<OpList>();
  list->Reserve(static_cast<int>(ops.size()));
  for (auto& op : ops) *list->Add() = std::move(op);
  SortByPhase(list.get());
  Load(std::move(list), std::move(routes), std::move(delta));
}

std::shared_ptr<const OpList> Executor::ops() const {
  absl::MutexLock lock(&mu_);
  return ops_;
}

void Executor::Load(std::shared_ptr<const OpList> ops, std::map<std::string, Route> routes,
                    std::shared_ptr<delta::DeltaSender> delta) {
  // A step of the old plan still running is stale: stop it and wait until it is gone.
  CancelCurrent("a new plan is being loaded");
  absl::MutexLock serial(&run_mu_);
  const bool relays = ops && std::any_of(ops->begin(), ops->end(),
                                         [](const v1::TransferOp& op) { return op.relay(); });
  absl::MutexLock lock(&mu_);
  delta_ = std::move(delta);
  ops_ = std::move(ops);
  routes_ = std::make_shared<const Routes>(std::move(routes));
  loaded_ = true;
  has_relays_ = relays;
}

bool Executor::has_relays() const {
  absl::MutexLock lock(&mu_);
  return has_relays_;
}

bool Executor::loaded() const {
  absl::MutexLock lock(&mu_);
  return loaded_;
}

void Executor::Cancel(uint64_t step_id, const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (delta_) delta_->Invalidate();  // the destination may hold part of a step
    // Remembered only for a step that has not started here: its Execute may still be on its
    // way. A step that ran here already may run again (the controller retries a step without
    // dropped receivers, and an agent holding one of them is aborted meanwhile).
    const bool running = current_ && current_->step_id == step_id;
    if (step_id != 0 && !running && last_started_step_ != step_id) cancelled_step_ = step_id;
    if (current_ && (step_id == 0 || current_->step_id == step_id) && !current_->cancelled) {
      current_->reason = reason;
      current_->cancelled = true;
    }
  }
  staging_->Poke();
}

void Executor::CancelCurrent(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (!current_ || current_->cancelled) return;
    current_->reason = reason;
    current_->cancelled = true;
    if (delta_) delta_->Invalidate();  // it did not finish: the destination may hold part of it
  }
  staging_->Poke();
}

absl::Status Executor::BuildWrites(const Job& job, std::vector<transport::WriteOp>* writes) const {
  const v1::TransferOp& op = *job.op;
  const uint32_t dst_size = tensor::DTypeBytes(op.dst_dtype());
  const uint32_t src_size = tensor::DTypeBytes(op.src_dtype());
  const uint64_t dst_row = op.row_elems() * dst_size;
  auto remote = [&](uint64_t region) -> absl::StatusOr<RemoteTarget> {
    auto it = job.route->remote_regions.find(region);
    if (it == job.route->remote_regions.end()) {
      return absl::NotFoundError(absl::StrCat(OpName(op), ": destination region ", region,
                                              " of agent ", op.dst_agent(),
                                              " was not introduced by the controller"));
    }
    return it->second;
  };
  // A write into one remote tensor: bounded by that tensor, placed in its transport region
  // (the receiver of a buffer registered once checks only that the bytes are a live tensor's).
  auto write = [&](uint64_t local_region, uint64_t local_offset, const RemoteTarget& to,
                   uint64_t remote_offset, uint64_t length) -> absl::Status {
    if (remote_offset > to.length || length > to.length - remote_offset) {
      return absl::OutOfRangeError(absl::StrCat(OpName(op), ": remote [", remote_offset, ", +",
                                                length, ") is out of bounds of its tensor (",
                                                to.length, " bytes)"));
    }
    writes->push_back({local_region, local_offset, to.region, to.base + remote_offset, length});
    return absl::OkStatus();
  };
  const std::string tname = job.route->transport->Name();
  if (job.packed) {
    auto slot = remote(job.slot_region);
    if (!slot.ok()) return slot.status();
    return write(job.staging->transport_regions.at(tname), 0, *slot, job.slot_offset,
                 job.packed_bytes);
  }
  auto dst = remote(op.dst_region());
  if (!dst.ok()) return dst.status();

  uint64_t local_region = 0;
  uint64_t base = 0;  // offset of row 0 in the local region
  uint64_t stride = 0;
  if (job.staging) {
    local_region = job.staging->transport_regions.at(tname);
    stride = dst_row;
  } else {
    auto it = job.source->transport_regions.find(tname);
    if (it == job.source->transport_regions.end()) {
      // A transport that declined the source (GPU memory it cannot pin) says why.
      auto declined = job.source->declined.find(tname);
      return absl::FailedPreconditionError(
          absl::StrCat(OpName(op), ": source not registered with ", tname,
                       declined != job.source->declined.end() ? ": " + declined->second : ""));
    }
    local_region = it->second;
    base = job.source->BaseIn(tname) + op.src_offset();  // the source's buffer, where registered
    stride = op.src_stride() ? op.src_stride() : op.row_elems() * src_size;
  }
  const uint64_t dst_stride = op.dst_stride() ? op.dst_stride() : dst_row;
  if (stride == dst_row && dst_stride == dst_row) {
    if (auto s = write(local_region, base, *dst, op.dst_offset(), dst_row * op.rows()); !s.ok()) {
      return s;
    }
  } else {
    for (uint64_t r = 0; r < op.rows(); ++r) {
      if (auto s = write(local_region, base + r * stride, *dst, op.dst_offset() + r * dst_stride,
                         dst_row);
          !s.ok()) {
        return s;
      }
    }
  }
  if (op.transform() == v1::TRANSFORM_FP8_BLOCK) {
    // Scales follow the data in staging: ceil(rows/128) block rows of ceil(cols/128) floats.
    auto scale_dst = remote(op.scale_region());
    if (!scale_dst.ok()) return scale_dst.status();
    const uint64_t block_rows = (op.rows() + 127) / 128;
    const uint64_t scale_row = (op.row_elems() + 127) / 128 * sizeof(float);
    const uint64_t scale_stride = op.scale_stride() ? op.scale_stride() : scale_row;
    const uint64_t scale_base = Fp8ScaleOffset(dst_row * op.rows());
    for (uint64_t r = 0; r < block_rows; ++r) {
      if (auto s = write(local_region, scale_base + r * scale_row, *scale_dst,
                         op.scale_offset() + r * scale_stride, scale_row);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::PrepareDelta(Job* job, const delta::StepDelta& step,
                                    delta::DeltaSender* delta, v1::AgentStepReport* report,
                                    absl::Mutex* report_mu, const std::atomic<bool>* cancelled) {
  const v1::TransferOp& op = *job->op;
  const delta::OpLayout* layout = delta->Layout(op.op_id());
  if (layout == nullptr) {
    return absl::InternalError(absl::StrCat(OpName(op), ": not in the delta state"));
  }
  const uint8_t* src = static_cast<const uint8_t*>(job->source->memory.addr);
  const uint64_t row = op.row_elems() * tensor::DTypeBytes(op.dst_dtype());
  const uint64_t stride = op.src_stride() ? op.src_stride() : row;
  const DeltaPath path =
      ChooseDeltaPath(preparer_->StagingBytes(op) > 0, stride == row, job->source->memory);
  if (path != DeltaPath::kStaged) {
    // A contiguous copy: compare the source in place (a CUDA source on its device); staging
    // only for a packed delta, and a dense outcome is written zero-copy as without delta mode.
    const auto t0 = Clock::now();
    std::vector<uint8_t> slot;
    auto out = path == DeltaPath::kDeviceInPlace
                   ? delta->ProcessOnDevice(op, src + op.src_offset(), job->source->memory.device,
                                            step, &slot)
                   : delta->ProcessInPlace(op, src + op.src_offset(), step, &slot);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat(OpName(op), ": ", out.status().message()));
    }
    const double encode_s = Since(t0);
    if (out->packed) {
      auto lease = staging_->Acquire(slot.size(), cancelled);
      if (!lease.ok()) return lease.status();
      job->staging = std::move(*lease);
      std::memcpy(job->staging->data, slot.data(), slot.size());
    }
    return RecordDelta(job, *out, encode_s, step, report, report_mu);
  }
  auto rows = HostSourceRows::Read(op, *job->source);  // CUDA sources: a host copy
  if (!rows.ok()) {
    return absl::Status(rows.status().code(),
                        absl::StrCat(OpName(op), ": ", rows.status().message()));
  }
  src = rows->base();
  auto lease = staging_->Acquire(layout->flat_bytes, cancelled);
  if (!lease.ok()) return lease.status();
  job->staging = std::move(*lease);
  if (preparer_->StagingBytes(op) > 0) {
    absl::Status s;
    if (!registry::RunBusGuarded(
            [&] { s = preparer_->Prepare(rows->op(), src, job->staging->data); })) {
      return MemoryVanished(OpName(op), *job->source);
    }
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(OpName(op), ": ", s.message()));
  } else {
    // A strided copy: gather its rows densely (the shadow compare needs them side by side).
    if (!registry::RunBusGuarded([&] {
          GatherRows(src + rows->op().src_offset(), row, stride, op.rows(), job->staging->data);
        })) {
      return MemoryVanished(OpName(op), *job->source);
    }
  }
  const auto t0 = Clock::now();
  auto out = delta->Process(op, job->staging->data, step);
  if (!out.ok()) {
    return absl::Status(out.status().code(),
                        absl::StrCat(OpName(op), ": ", out.status().message()));
  }
  // Dense: the staging buffer still holds the op's bytes; packed: the slot write.
  return RecordDelta(job, *out, Since(t0), step, report, report_mu);
}

absl::Status Executor::RecordDelta(Job* job, const delta::OpOutcome& out, double encode_seconds,
                                   const delta::StepDelta& step, v1::AgentStepReport* report,
                                   absl::Mutex* report_mu) {
  const v1::TransferOp& op = *job->op;
  job->packed = out.packed;
  job->slot_region = out.slot_region;
  job->slot_offset = out.slot_offset;
  job->packed_bytes = out.write_bytes;
  absl::MutexLock lock(report_mu);
  report->set_encode_seconds(report->encode_seconds() + encode_seconds);
  if (out.packed) {
    report->set_delta_ops(report->delta_ops() + 1);
  } else {
    report->set_dense_ops(report->dense_ops() + 1);
  }
  if (step.verify) {
    v1::OpHash* h = report->add_hashes();
    h->set_op_id(op.op_id());
    h->set_dst_agent(op.dst_agent());
    h->set_hash(out.hash);
  }
  return absl::OkStatus();
}

// One phase in flight: the queues between its stages, its first error, and what the stages
// add to the report. Shared with every posted batch's completion: a peer that drains slowly
// can complete a batch after the phase gave up on it (the step already failed), so the
// completion must never reference RunPhase's frame.
struct Executor::PhaseRun {
  PhaseRun(std::shared_ptr<const OpList> plan, std::shared_ptr<const Routes> routes,
           std::shared_ptr<StepRun> step_run, Clock::time_point deadline,
           const delta::StepDelta& step, delta::DeltaSender* delta, const CapturedSources* captured,
           v1::AgentStepReport* report, int prepare_threads)
      : plan(std::move(plan)),
        routes(std::move(routes)),
        step_run(std::move(step_run)),
        deadline(deadline),
        step(step),
        delta(delta),
        captured(captured),
        report(report),
        preparers_left(prepare_threads),
        preparers_running(prepare_threads) {}

  // Keeps the ops alive for late completions (Posted::op points into it).
  const std::shared_ptr<const OpList> plan;
  // The routes this step started with (Job::route points into them): a Load meanwhile swaps
  // in new ones without pulling these from under the step.
  const std::shared_ptr<const Routes> routes;
  const std::shared_ptr<StepRun> step_run;  // the step's id and cancellation
  const Clock::time_point deadline;         // nothing is posted after it
  // The three below are used by the stages only, never by completions: they live in
  // Execute's frame.
  const delta::StepDelta& step;
  delta::DeltaSender* delta;        // null unless this step runs in delta mode
  const CapturedSources* captured;  // null unless this step sends from a capture
  v1::AgentStepReport* report;
  absl::Mutex report_mu;  // preparers add delta counts and hashes
  const Clock::time_point t0 = Clock::now();
  BlockingQueue<Job> to_prepare;
  BlockingQueue<Job> to_write;
  ErrorSlot error;
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_dense{0};
  std::atomic<int64_t> prepare_ns{0}, complete_ns{0};
  // The write stage's wall time: from the first post to the last completion of the phase.
  std::atomic<int64_t> first_post_ns{0}, last_done_ns{0};
  // Relay writes: bytes forwarded, and the time any was on the wire (AgentStepReport).
  absl::Mutex relay_mu;
  int relays_in_flight ABSL_GUARDED_BY(relay_mu) = 0;
  Clock::time_point relay_busy_since ABSL_GUARDED_BY(relay_mu);
  int64_t relay_busy_ns ABSL_GUARDED_BY(relay_mu) = 0;
  std::atomic<uint64_t> bytes_forwarded{0};
  void RelayPosted() {
    absl::MutexLock lock(&relay_mu);
    if (relays_in_flight++ == 0) relay_busy_since = Clock::now();
  }
  void RelayDone() {
    absl::MutexLock lock(&relay_mu);
    if (--relays_in_flight == 0) relay_busy_ns += (Clock::now() - relay_busy_since).count();
  }
  double ForwardSeconds() {
    absl::MutexLock lock(&relay_mu);
    int64_t ns = relay_busy_ns;
    if (relays_in_flight > 0) ns += (Clock::now() - relay_busy_since).count();  // abandoned
    return ns * 1e-9;
  }
  // The last preparer to finish closes the write queue.
  std::atomic<int> preparers_left;
  // A std::mutex latch: an absl::Mutex made and destroyed per phase costs a deadlock-graph
  // update each time with the system absl.
  std::mutex preparers_mu;
  std::condition_variable preparers_done;
  int preparers_running;  // guarded by preparers_mu
  absl::Mutex done_mu;
  int64_t outstanding ABSL_GUARDED_BY(done_mu) = 0;  // batches posted and not yet completed
  // The same per destination agent, to name the slow ones at the deadline.
  std::map<std::string, int64_t> outstanding_by_peer ABSL_GUARDED_BY(done_mu);
};

// What a posted batch's completion needs.
struct Executor::Posted {
  const v1::TransferOp* op = nullptr;  // into PhaseRun::plan; the first of a group
  int64_t ops = 1;                     // a group's ops (WriteGroup)
  // Zero-copy writes read their memory: each op's source (one per op of a group).
  std::vector<std::shared_ptr<const registry::RegisteredTensor>> sources;
  uint64_t bytes = 0;
  uint64_t dense = 0;
  bool relay = false;
  metrics::Counter* peer_bytes = nullptr;
  std::shared_ptr<StagingLease> staging;  // shared: transport callbacks must be copyable
};

absl::Status Executor::RunPhase(std::shared_ptr<const OpList> plan,
                                std::shared_ptr<const Routes> routes,
                                std::shared_ptr<StepRun> step_run,
                                const std::vector<const v1::TransferOp*>& ops,
                                Clock::time_point deadline, const delta::StepDelta& step,
                                delta::DeltaSender* delta, const CapturedSources* captured,
                                v1::AgentStepReport* report) {
  auto shared_run =
      std::make_shared<PhaseRun>(std::move(plan), std::move(routes), std::move(step_run), deadline,
                                 step, delta, captured, report, options_.prepare_threads);
  PhaseRun& run = *shared_run;
  // A phase with relay ops stages in on its own thread: they are handed on as their bytes land,
  // while the stages below already prepare and write what is ready.
  const bool relays =
      std::any_of(ops.begin(), ops.end(), [](const v1::TransferOp* op) { return op->relay(); });
  std::thread stage_in;
  if (relays) {
    stage_in = std::thread([this, &ops, &run] { StageIn(ops, &run); });
  } else {
    StageIn(ops, &run);
  }
  // A phase that transforms nothing (every op written zero-copy from its source, no delta, no
  // capture) has no work for the prepare pool: its ops are posted from this thread, without two
  // thread hand-offs per op (a BF16 -> BF16 push: ~2,000 ops a step).
  const bool zero_copy = !relays && delta == nullptr && captured == nullptr &&
                         std::all_of(ops.begin(), ops.end(), [&](const v1::TransferOp* op) {
                           return preparer_->StagingBytes(*op) == 0;
                         });
  if (!relays && (ops.size() <= kInlinePhaseOps || zero_copy)) {
    PrepareAndWriteInline(shared_run);
  } else {
    for (int i = 0; i < options_.prepare_threads; ++i) {
      prepare_pool_.Submit([this, &run] { PrepareStage(&run); });
    }
    WriteStage(shared_run);
    // The prepare tasks reference this frame: wait until every one has returned.
    std::unique_lock<std::mutex> lock(run.preparers_mu);
    run.preparers_done.wait(lock, [&] { return run.preparers_running == 0; });
  }
  if (stage_in.joinable()) stage_in.join();  // it closed to_prepare: it has returned or is about to
  AwaitCompletions(&run, deadline);
  if (run.error.failed() || run.step_run->cancelled) AbandonOutstanding(&run);
  auto* st = report->mutable_stages();
  st->set_prepare_seconds(st->prepare_seconds() + run.prepare_ns.load() * 1e-9);
  if (run.first_post_ns.load() > 0 && run.last_done_ns.load() > run.first_post_ns.load()) {
    st->set_write_seconds(st->write_seconds() +
                          (run.last_done_ns.load() - run.first_post_ns.load()) * 1e-9);
  }
  st->set_complete_seconds(st->complete_seconds() + run.complete_ns.load() * 1e-9);
  report->set_bytes_sent(report->bytes_sent() + run.bytes_sent.load());
  report->set_bytes_dense(report->bytes_dense() + run.bytes_dense.load());
  if (relays) {
    report->set_bytes_forwarded(report->bytes_forwarded() + run.bytes_forwarded.load());
    report->set_forward_seconds(report->forward_seconds() + run.ForwardSeconds());
  }
  if (run.step_run->cancelled && run.error.Get().ok()) {
    absl::MutexLock lock(&mu_);
    return absl::AbortedError(absl::StrCat("step cancelled: ", run.step_run->reason));
  }
  return run.error.Get();
}

void Executor::StageIn(const std::vector<const v1::TransferOp*>& ops, PhaseRun* run) {
  // Every transform runs on the CPU: host sources are read where they are mapped, CUDA
  // sources are copied to the host by the preparer that needs them (gpu_source.h).
  const auto t_in = Clock::now();
  std::unordered_set<const registry::RegisteredTensor*> checked;
  std::vector<Job> relays;
  for (const v1::TransferOp* op : ops) {
    Job job;
    job.op = op;
    if (run->captured != nullptr) job.source = run->captured->For(*op);
    job.captured = job.source != nullptr;
    if (!job.captured) job.source = registry_->Find(op->src_region());
    if (!job.source) {
      run->error.Set(absl::FailedPreconditionError(
          absl::StrCat(OpName(*op), ": source region ", op->src_region(),
                       " is gone (its process unregistered or exited)")));
      break;
    }
    if (auto s = CheckSourceOp(*op, job.source->memory.length); !s.ok()) {
      run->error.Set(absl::Status(s.code(), absl::StrCat(OpName(*op), ": ", s.message())));
      break;
    }
    // Its owner may have shrunk the memory since registration: one fstat per source tensor
    // and phase, so that a shrink before the step fails it cleanly (a shrink racing the copy
    // meets the SIGBUS guard).
    if (job.source->hold && checked.insert(job.source.get()).second) {
      if (auto s = job.source->hold->CheckBacked(job.source->memory.addr, job.source->memory.length,
                                                 TensorAndOwner(*job.source));
          !s.ok()) {
        run->error.Set(absl::Status(s.code(), absl::StrCat(OpName(*op), ": ", s.message())));
        break;
      }
    }
    {
      auto it = run->routes->find(op->dst_agent());
      if (it == run->routes->end()) {
        run->error.Set(absl::FailedPreconditionError(
            absl::StrCat(OpName(*op), ": no connection to agent ", op->dst_agent())));
        break;
      }
      job.route = &it->second;
    }
    if (op->relay()) {
      relays.push_back(std::move(job));  // sent once its bytes have landed here
      continue;
    }
    run->to_prepare.Push(std::move(job));
  }
  if (!relays.empty() && !run->error.failed()) ForwardWhenLanded(std::move(relays), run);
  run->to_prepare.Close();
  auto* st = run->report->mutable_stages();
  st->set_stage_in_seconds(st->stage_in_seconds() + Since(t_in));
}

void Executor::ForwardWhenLanded(std::vector<Job> relays, PhaseRun* run) {
  if (landing_ == nullptr) {
    run->error.Set(absl::FailedPreconditionError(absl::StrCat(
        OpName(*relays.front().op), ": a relay op, but this agent does not track landed bytes")));
    return;
  }
  const uint64_t step = run->step_run->step_id;
  // Stage-in checked each op's bounds (CheckSourceOp): its span lies inside its region.
  auto landed = [&](const Job& job) {
    const auto* base = static_cast<const uint8_t*>(job.source->memory.addr) + job.op->src_offset();
    return landing_->Covered(step, base, SourceSpan(*job.op));
  };
  // The waiting ops by their first source byte: a pass looks only at the ops inside the ranges
  // that grew since the last one (LandingTracker::TakeTouched), not at every waiting op.
  auto first_byte = [](const Job& job) {
    return reinterpret_cast<uintptr_t>(job.source->memory.addr) + job.op->src_offset();
  };
  std::multimap<uintptr_t, Job> waiting;
  for (Job& job : relays) {
    const uintptr_t at = first_byte(job);
    waiting.emplace(at, std::move(job));
  }
  relays.clear();
  std::vector<LandingTracker::Range> touched;
  landing_->TakeTouched(step, &touched);  // what landed so far: the first pass looks at all
  bool look_at_all = true;
  // Each pass hands on every relay op whose bytes are all in, then waits for more to land.
  uint64_t seen = landing_->changes();
  while (!waiting.empty()) {
    if (look_at_all) {
      for (auto it = waiting.begin(); it != waiting.end();) {
        if (landed(it->second)) {
          run->to_prepare.Push(std::move(it->second));
          it = waiting.erase(it);
        } else {
          ++it;
        }
      }
    } else {
      for (const auto& r : touched) {
        for (auto it = waiting.lower_bound(r.begin); it != waiting.end() && it->first < r.end;) {
          if (it->first + SourceSpan(*it->second.op) <= r.end) {
            run->to_prepare.Push(std::move(it->second));
            it = waiting.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    if (waiting.empty()) break;
    const Job& front = waiting.begin()->second;
    if (run->error.failed()) return;
    if (run->step_run->cancelled) {
      run->error.Set(absl::CancelledError("step cancelled while relay ops wait for bytes"));
      return;
    }
    // A relay is fed by one agent (its parent, or the senders for a root): once an agent
    // writing here has gone, the bytes still awaited may never come; fail now, not at the
    // deadline, so the controller can drop this subtree and finish the step in time.
    if (const std::string gone = landing_->EndedAmong(run->step_run->feeders); !gone.empty()) {
      run->error.Set(absl::UnavailableError(
          absl::StrCat(OpName(*front.op), " and ", waiting.size() - 1, " more relay ops: agent ",
                       gone, ", which writes into this relay, went away mid-step")));
      return;
    }
    if (Clock::now() >= run->deadline) {
      run->error.Set(absl::DeadlineExceededError(absl::StrCat(
          OpName(*front.op), " and ", waiting.size() - 1,
          " more relay ops: their bytes had not all landed here by the step's deadline")));
      return;
    }
    // Wakes on every landing; at most every 50 ms to see cancellation and the deadline.
    seen = landing_->WaitChange(seen, std::min(run->deadline, Clock::now() + kRelayPoll));
    look_at_all = !landing_->TakeTouched(step, &touched);
  }
}

void Executor::PrepareStage(PhaseRun* run) {
  while (auto job = run->to_prepare.Pop()) {
    if (run->error.failed() || run->step_run->cancelled) continue;
    const auto t0 = Clock::now();
    if (auto s = Prepare(&*job, run); !s.ok()) {
      run->error.Set(s);
      continue;  // the job, and its staging with it, is dropped
    }
    run->prepare_ns += (Clock::now() - t0).count();
    run->to_write.Push(std::move(*job));
  }
  if (--run->preparers_left == 0) run->to_write.Close();
  std::lock_guard<std::mutex> lock(run->preparers_mu);
  if (--run->preparers_running == 0) run->preparers_done.notify_all();
}

absl::Status Executor::Prepare(Job* job, PhaseRun* run) {
  if (run->delta != nullptr) {
    const delta::OpLayout* layout = run->delta->Layout(job->op->op_id());
    job->dense_bytes = layout ? layout->dense_bytes : 0;
    if (auto s = PrepareDelta(job, run->step, run->delta, run->report, &run->report_mu,
                              &run->step_run->cancelled);
        !s.ok()) {
      return s;
    }
    return StageCaptured(job, &run->step_run->cancelled);
  }
  const uint64_t need = preparer_->StagingBytes(*job->op);
  // Written zero-copy from the source, unless the source is a capture.
  if (need == 0) return StageCaptured(job, &run->step_run->cancelled);
  auto lease = staging_->Acquire(need, &run->step_run->cancelled);
  if (!lease.ok()) return lease.status();
  job->staging = std::move(*lease);
  auto rows = HostSourceRows::Read(*job->op, *job->source);  // CUDA sources: a host copy
  if (!rows.ok()) {
    return absl::Status(rows.status().code(),
                        absl::StrCat(OpName(*job->op), ": ", rows.status().message()));
  }
  absl::Status s;
  if (!registry::RunBusGuarded(
          [&] { s = preparer_->Prepare(rows->op(), rows->base(), job->staging->data); })) {
    return MemoryVanished(OpName(*job->op), *job->source);
  }
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(OpName(*job->op), ": ", s.message()));
  return absl::OkStatus();
}

absl::Status Executor::StageCaptured(Job* job, const std::atomic<bool>* cancelled) {
  if (!job->captured || job->packed || job->staging) return absl::OkStatus();
  const v1::TransferOp& op = *job->op;
  const uint64_t row = op.row_elems() * tensor::DTypeBytes(op.dst_dtype());
  auto rows = HostSourceRows::Read(op, *job->source);  // a device capture: a host copy
  if (!rows.ok()) {
    return absl::Status(rows.status().code(),
                        absl::StrCat(OpName(op), ": ", rows.status().message()));
  }
  auto lease = staging_->Acquire(row * op.rows(), cancelled);
  if (!lease.ok()) return lease.status();
  job->staging = std::move(*lease);
  const uint64_t stride = op.src_stride() ? op.src_stride() : row;
  GatherRows(rows->base() + rows->op().src_offset(), row, stride, op.rows(), job->staging->data);
  return absl::OkStatus();
}

void Executor::PrepareAndWriteInline(const std::shared_ptr<PhaseRun>& run) {
  const bool hold = Holds(*run);
  // Consecutive zero-copy ops to one destination agent go as one batch (ops of a BF16 model are
  // 0.5-1.5 MiB: one batch each cost a completion, and for tcp a FLUSH and an ACK, apiece).
  std::vector<Job> group;
  uint64_t group_bytes = 0;
  auto flush = [&] {
    if (group.empty()) return;
    WriteGroup(std::move(group), run);
    group.clear();
    group_bytes = 0;
  };
  while (auto job = run->to_prepare.Pop()) {
    if (run->error.failed() || run->step_run->cancelled) continue;
    const auto t0 = Clock::now();
    if (auto s = Prepare(&*job, run.get()); !s.ok()) {
      run->error.Set(s);
      continue;
    }
    run->prepare_ns += (Clock::now() - t0).count();
    if (!hold && Groupable(*job)) {
      const v1::TransferOp& op = *job->op;
      const uint64_t bytes = op.rows() * op.row_elems() * tensor::DTypeBytes(op.dst_dtype());
      if (!group.empty() &&
          (group.front().route != job->route || group_bytes + bytes > kGroupBytes)) {
        flush();
      }
      group_bytes += bytes;
      group.push_back(std::move(*job));
      continue;
    }
    flush();
    Write(std::move(*job), run, hold);  // before the next op takes staging
  }
  flush();
}

bool Executor::Groupable(const Job& job) { return !job.staging && !job.packed && !job.op->relay(); }

void Executor::WriteGroup(std::vector<Job> jobs, const std::shared_ptr<PhaseRun>& run) {
  if (jobs.size() == 1) {
    Write(std::move(jobs.front()), run, /*hold=*/false);
    return;
  }
  if (run->error.failed() || run->step_run->cancelled) return;
  if (Clock::now() >= run->deadline) {
    run->error.Set(absl::DeadlineExceededError(
        absl::StrCat(OpName(*jobs.front().op), " and ", jobs.size() - 1,
                     " more: the step deadline passed before they could be written (not sent)")));
    return;
  }
  if (auto s = PostJobs(std::move(jobs), run); !s.ok()) run->error.Set(s);
}

bool Executor::Holds(const PhaseRun& run) const {
  return options_.test_hold.count() > 0 && options_.test_hold_version != 0 &&
         run.step.version == options_.test_hold_version;
}

void Executor::WriteStage(const std::shared_ptr<PhaseRun>& run) {
  const bool hold = Holds(*run);
  while (auto job = run->to_write.Pop()) Write(std::move(*job), run, hold);
}

void Executor::Write(Job job, const std::shared_ptr<PhaseRun>& run, bool hold) {
  // A dropped job gives its staging back. The step's own flag: the next step never clears it.
  if (run->error.failed() || run->step_run->cancelled) return;
  if (hold) std::this_thread::sleep_for(options_.test_hold);
  if (run->error.failed() || run->step_run->cancelled) return;
  // A write posted after the deadline would land after the controller gave up on the step
  // (and maybe after the next one began): never post late.
  if (Clock::now() >= run->deadline) {
    run->error.Set(absl::DeadlineExceededError(absl::StrCat(
        OpName(*job.op), ": the step deadline passed before it could be written (not sent)")));
    return;
  }
  if (auto s = Post(std::move(job), run); !s.ok()) run->error.Set(s);
}

absl::Status Executor::Post(Job job, const std::shared_ptr<PhaseRun>& run) {
  std::vector<Job> jobs;
  jobs.push_back(std::move(job));
  return PostJobs(std::move(jobs), run);
}

absl::Status Executor::PostJobs(std::vector<Job> jobs, const std::shared_ptr<PhaseRun>& run) {
  std::vector<transport::WriteOp> writes;
  Posted posted;
  posted.op = jobs.front().op;
  posted.ops = static_cast<int64_t>(jobs.size());
  for (const Job& job : jobs) {
    const size_t first = writes.size();
    if (auto s = BuildWrites(job, &writes); !s.ok()) return s;
    uint64_t bytes = 0;
    for (size_t i = first; i < writes.size(); ++i) bytes += writes[i].length;
    posted.bytes += bytes;
    posted.dense += job.dense_bytes ? job.dense_bytes : bytes;
    posted.sources.push_back(job.source);
  }
  for (auto& w : writes) w.step = run->step_run->step_id;  // the receivers' step fence
  const Route* route = jobs.front().route;
  posted.peer_bytes = route->bytes_sent;
  // A group holds no staging (Groupable): only a lone job's lease travels.
  posted.staging = std::make_shared<StagingLease>(std::move(jobs.front().staging));
  posted.relay = posted.op->relay();
  if (posted.relay) run->RelayPosted();
  {
    absl::MutexLock lock(&run->done_mu);
    ++run->outstanding;
    ++run->outstanding_by_peer[posted.op->dst_agent()];
  }
  if (run->first_post_ns.load() == 0) {
    run->first_post_ns = std::max<int64_t>(1, (Clock::now() - run->t0).count());
  }
  ops_in_flight_.fetch_add(posted.ops, std::memory_order_relaxed);
  route->peer->PostBatch(std::move(writes), [this, run, posted](absl::Status s) {
    Complete(run.get(), posted, std::move(s));
  });
  return absl::OkStatus();
}

void Executor::AbandonOutstanding(PhaseRun* run) {
  std::vector<std::pair<std::string, int64_t>> holding;
  {
    absl::MutexLock lock(&run->done_mu);
    for (const auto& [peer, n] : run->outstanding_by_peer) holding.emplace_back(peer, n);
  }
  if (holding.empty()) return;
  // Not under done_mu: abandoning completes the batches, and completions take it.
  for (const auto& [peer, n] : holding) {
    auto it = run->routes->find(peer);
    if (it == run->routes->end() || !it->second.peer) continue;
    it->second.peer->Abandon(absl::StrCat("step of version ", run->step.version, " given up with ",
                                          n, " batch(es) to '", peer, "' outstanding"));
  }
  absl::MutexLock lock(&run->done_mu);
  auto all_done = [run]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run->done_mu) { return run->outstanding == 0; };
  if (!run->done_mu.AwaitWithTimeout(absl::Condition(&all_done), absl::Seconds(5))) {
    // Their completions (and staging, and source) stay alive through the shared phase state;
    // the receivers' step fence refuses whatever still arrives.
    spdlog::error(
        "step of version {}: {} batch(es) still not completed 5 s after they were "
        "abandoned",
        run->step.version, run->outstanding);
  }
}

void Executor::Complete(PhaseRun* run, const Posted& posted, absl::Status s) {
  const auto c0 = Clock::now();
  int64_t done_ns = (c0 - run->t0).count(), prev = run->last_done_ns.load();
  while (done_ns > prev && !run->last_done_ns.compare_exchange_weak(prev, done_ns)) {
  }
  ops_in_flight_.fetch_sub(posted.ops, std::memory_order_relaxed);
  posted.staging->Release();  // the watermark frees as each batch lands
  if (posted.relay) {
    if (s.ok()) run->bytes_forwarded += posted.bytes;
    run->RelayDone();
  }
  if (s.ok()) {
    run->bytes_sent += posted.bytes;
    run->bytes_dense += posted.dense;
    if (posted.peer_bytes) posted.peer_bytes->Increment(posted.bytes);
  } else {
    run->error.Set(absl::Status(
        s.code(), absl::StrCat(OpName(*posted.op),
                               posted.ops > 1 ? absl::StrCat(" (in one batch with ", posted.ops - 1,
                                                             " more ops)")
                                              : "",
                               ": ", s.message())));
  }
  run->complete_ns += (Clock::now() - c0).count();
  absl::MutexLock lock(&run->done_mu);
  --run->outstanding;
  auto peer = run->outstanding_by_peer.find(posted.op->dst_agent());
  if (peer != run->outstanding_by_peer.end() && --peer->second == 0) {
    run->outstanding_by_peer.erase(peer);
  }
}

void Executor::AwaitCompletions(PhaseRun* run, Clock::time_point deadline) {
  absl::MutexLock lock(&run->done_mu);
  auto all_done = [run]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run->done_mu) { return run->outstanding == 0; };
  while (!all_done()) {
    if (Clock::now() >= deadline || run->step_run->cancelled) break;
    run->done_mu.AwaitWithTimeout(absl::Condition(&all_done), absl::Milliseconds(50));
  }
  if (run->outstanding == 0) return;
  if (run->step_run->cancelled && Clock::now() < deadline) {
    run->error.Set(absl::AbortedError(
        absl::StrCat("step cancelled with ", run->outstanding, " batch(es) unacknowledged")));
    return;
  }
  // A slow or stalled peer fails the step, never the process: the batches still out keep the
  // phase (and their staging and source) alive through their completions, which may come late.
  std::vector<std::string> slow;
  for (const auto& [peer, n] : run->outstanding_by_peer) {
    slow.push_back(absl::StrCat("'", peer, "' (", n, ")"));
  }
  run->error.Set(absl::DeadlineExceededError(absl::StrCat(
      "slow peer: ", run->outstanding, " batch(es) still unacknowledged at the step deadline by ",
      absl::StrJoin(slow, ", "))));
}

v1::AgentStepReport Executor::Execute(uint64_t version, std::chrono::milliseconds timeout,
                                      delta::StepDelta step, const std::set<std::string>& skip,
                                      uint64_t step_id,
                                      std::shared_ptr<const CapturedSources> captured,
                                      const std::set<std::string>& feeders,
                                      const TensorFilter& tensors) {
  v1::AgentStepReport report;
  const auto t0 = Clock::now();
  const auto deadline = t0 + timeout;
  // A step still running is one the controller gave up on: stop it, and wait until nothing of
  // it is left (its executor finished, its outstanding batches abandoned).
  CancelCurrent(absl::StrCat("superseded by a step of version ", version));
  absl::MutexLock serial(&run_mu_);
  auto step_run = std::make_shared<StepRun>(step_id);
  step_run->feeders = feeders;
  std::shared_ptr<const OpList> plan;
  std::shared_ptr<const Routes> routes;
  {
    absl::MutexLock lock(&mu_);
    if (!loaded_) {
      report.set_ok(false);
      report.set_error("no plan loaded");
      return report;
    }
    if (step_id != 0 && step_id == cancelled_step_) {
      report.set_ok(false);
      report.set_error(absl::StrCat("step ", version, " was aborted before it started here"));
      return report;
    }
    current_ = step_run;
    last_started_step_ = step_id;
    routes = routes_;
  }
  staging_->ResetPeak();
  std::vector<const v1::TransferOp*> phase;
  absl::Status status;
  std::shared_ptr<delta::DeltaSender> delta;
  {
    absl::MutexLock lock(&mu_);
    // Shared, not copied: a concurrent Load swaps in a new vector and never changes this one
    // under the step (or under a late completion of it).
    plan = ops_;
    if (step.enabled) delta = delta_;
  }
  // After an abort or a failed step the destination may hold part of a step: anchor.
  if (delta && delta->TakeInvalidated()) step.anchor = true;
  // A destination dropped from this step holds an older version than the shadows will: every
  // later step must be dense until an anchor refreshes them all (the controller anchors).
  if (delta && !skip.empty()) delta->Invalidate();
  step.version = version;
  const OpList& ops = *plan;
  // The destinations this step skips, and the tensors a partial step leaves (frozen or not
  // changed), are left out; a phase left empty is not run.
  auto runs = [&](const v1::TransferOp& op) {
    return (skip.empty() || !skip.count(op.dst_agent())) && tensors.Keeps(op.src_tensor());
  };
  uint64_t run_ops = ops.size();
  if (!skip.empty() || !tensors.empty()) run_ops = std::count_if(ops.begin(), ops.end(), runs);
  for (int i = 0; i < ops.size() && status.ok(); ++i) {
    if (runs(ops[i])) phase.push_back(&ops[i]);
    if (i + 1 == ops.size() || ops[i + 1].phase() != ops[i].phase()) {
      if (!phase.empty()) {
        status = RunPhase(plan, routes, step_run, phase, deadline, step, delta.get(),
                          captured.get(), &report);
      }
      phase.clear();
    }
  }
  report.set_ops(run_ops);
  if (!delta) {
    report.set_bytes_dense(report.bytes_sent());
    report.set_dense_ops(run_ops);
  }
  if (delta && !status.ok()) delta->Invalidate();
  report.mutable_stages()->set_peak_staging_bytes(staging_->peak_in_flight());
  {
    absl::MutexLock lock(&mu_);
    if (current_ == step_run) current_.reset();
  }
  report.set_seconds(Since(t0));
  report.set_ok(status.ok());
  if (!status.ok()) report.set_error(std::string(status.message()));
  spdlog::info("step {}: {} ops, {} bytes in {:.3f} s{}", version, run_ops, report.bytes_sent(),
               report.seconds(), status.ok() ? "" : " FAILED: " + std::string(status.message()));
  return report;
}

}  // namespace wb::executor
