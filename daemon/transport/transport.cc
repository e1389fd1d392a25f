#include "daemon/transport/transport.h"

#include <condition_variable>
#include <mutex>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace wb::transport {
namespace {
constexpr char kDeclinedPayload[] = "type.weightbeam.dev/transport.declined";
}  // namespace

absl::Status DeclineRegion(const std::string& why) {
  absl::Status s = absl::UnavailableError(why);
  s.SetPayload(kDeclinedPayload, absl::Cord("1"));
  return s;
}

bool IsDeclined(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kDeclinedPayload).has_value();
}

absl::Status Peer::WriteBatch(std::vector<WriteOp> ops, std::chrono::milliseconds timeout) {
  // Shared with the callback: it may still run after a timeout made us return.
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::Status status;
  };
  auto waiter = std::make_shared<Waiter>();
  const size_t num_ops = ops.size();
  PostBatch(std::move(ops), [waiter](absl::Status status) {
    std::lock_guard<std::mutex> lock(waiter->mu);
    waiter->done = true;
    waiter->status = std::move(status);
    waiter->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(waiter->mu);
  if (!waiter->cv.wait_for(lock, timeout, [&] { return waiter->done; })) {
    return absl::DeadlineExceededError(absl::StrCat("peer '", name(), "': batch of ", num_ops,
                                                    " writes did not complete within ",
                                                    timeout.count(), " ms"));
  }
  return waiter->status;
}

}  // namespace wb::transport

namespace wb::transport {

// Transports without windows register per tensor.
absl::StatusOr<weightbeam::v1::RegionDescriptor> Transport::RegisterBuffer(const MemoryRef&,
                                                                           Access) {
  return absl::UnimplementedError(Name() + " registers each tensor on its own (no windows)");
}
absl::Status Transport::OpenWindow(uint64_t, uint64_t, uint64_t) {
  return absl::UnimplementedError(Name() + " has no windows");
}
absl::Status Transport::CloseWindow(uint64_t, uint64_t, uint64_t) {
  return absl::UnimplementedError(Name() + " has no windows");
}

absl::Status Transport::CloseWindows(uint64_t region_id,
                                     const std::vector<std::pair<uint64_t, uint64_t>>& windows) {
  absl::Status first;
  for (const auto& [offset, length] : windows) {
    absl::Status s = CloseWindow(region_id, offset, length);
    if (first.ok()) first = s;
  }
  return first;
}
absl::StatusOr<weightbeam::v1::RegionDescriptor> Transport::BufferKeys(uint64_t) {
  return absl::UnimplementedError(Name() + " does not rekey buffers");
}

}  // namespace wb::transport
