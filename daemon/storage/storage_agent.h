// The storage path inside wb-agent (config `storage`): on a publishing agent, PublishVersion
// requests write the registered trainer tensors into the directory; on a subscribing agent a
// thread polls the directory and applies complete versions into the registered inference
// tensors, announcing begin / commit (or abort with the reason) like a network step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "config/config.h"
#include "daemon/registry/region_registry.h"
#include "daemon/storage/delta_store.h"
#include "weightbeam/v1/local.pb.h"

namespace wb::storage {

struct VersionEvents {
  std::function<absl::Status(uint64_t version)> begin;
  std::function<absl::Status(uint64_t version)> commit;
  std::function<void(uint64_t version, const std::string& reason)> abort;
};

class StorageAgent {
 public:
  StorageAgent(const config::StorageConfig& config, const std::string& agent_name,
               registry::RegionRegistry* registry, VersionEvents events);
  ~StorageAgent();

  // Creates the directory when missing and, when subscribing, starts the polling thread.
  absl::Status Start();
  // Stops polling and waits for a publish in progress.
  void Stop();

  // Publishing agents: writes version `version` of every registered trainer tensor.
  absl::StatusOr<weightbeam::v1::PublishResult> Publish(uint64_t version);

 private:
  // Registered tensors of `role` as buffers; `holds` keeps their memory mapped meanwhile.
  absl::StatusOr<std::vector<ShardBuffer>> Buffers(
      weightbeam::v1::Role role,
      std::vector<std::shared_ptr<const registry::RegisteredTensor>>* holds);
  void PollLoop();

  const config::StorageConfig config_;
  const std::string agent_name_;
  registry::RegionRegistry* registry_;
  VersionEvents events_;

  absl::Mutex publish_mu_;
  std::unique_ptr<DeltaPublisher> publisher_ ABSL_GUARDED_BY(publish_mu_);
  bool stopped_ ABSL_GUARDED_BY(publish_mu_) = false;

  std::unique_ptr<DeltaSubscriber> subscriber_;  // owned by the polling thread
  absl::Mutex poll_mu_;
  bool stop_polling_ ABSL_GUARDED_BY(poll_mu_) = false;
  std::string last_problem_;  // polling thread only: logged once until it changes
  std::thread poller_;
};

}  // namespace wb::storage
