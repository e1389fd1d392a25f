#include "daemon/transport/transport.h"

#include <future>

namespace wb::transport {

absl::Status Peer::WriteBatch(std::vector<WriteOp> ops, std::chrono::milliseconds timeout) {
  auto promise = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = promise->get_future();
  PostBatch(std::move(ops), [promise](absl::Status status) { promise->set_value(status); });
  if (result.wait_for(timeout) != std::future_status::ready) {
    return absl::DeadlineExceededError("write batch to peer '" + name() + "' did not finish in " +
                                       std::to_string(timeout.count()) + " ms");
  }
  return result.get();
}

}  // namespace wb::transport
