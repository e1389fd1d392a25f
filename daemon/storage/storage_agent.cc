#include "daemon/storage/storage_agent.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "daemon/storage/manifest_mac.h"
#include "daemon/storage/safetensors.h"
#include "daemon/storage/store_layout.h"

namespace wb::storage {

namespace v1 = weightbeam::v1;

namespace {

// The token that keys manifests: the file's contents without surrounding white space.
absl::StatusOr<std::string> ReadToken(const std::string& path) {
  auto bytes = ReadWholeFile(path, 64 << 10);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "storage token (storage.token_file or tls.token_file): ", bytes.status().message()));
  }
  std::string token(absl::StripAsciiWhitespace(std::string(bytes->begin(), bytes->end())));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage token (storage.token_file or tls.token_file): ", path, " is empty"));
  }
  return token;
}

}  // namespace

StorageAgent::StorageAgent(const config::StorageConfig& config, const std::string& agent_name,
                           registry::RegionRegistry* registry, VersionEvents events)
    : config_(config), agent_name_(agent_name), registry_(registry), events_(std::move(events)) {}

StorageAgent::~StorageAgent() { Stop(); }

absl::Status StorageAgent::Start() {
  struct stat st {};
  if (::stat(config_.dir.c_str(), &st) != 0) {
    if (::mkdir(config_.dir.c_str(), 0755) != 0) {
      return absl::NotFoundError(
          absl::StrCat("storage.dir ", config_.dir,
                       " does not exist and cannot be created: ", std::strerror(errno)));
    }
  } else if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage.dir ", config_.dir, " is not a directory"));
  }
  StoreOptions options;
  options.dir = config_.dir;
  options.writer = agent_name_;
  options.anchor_every = config_.anchor_every;
  options.prune = config_.prune;
  options.writers = config_.writers;
  options.renames = config_.renames;
  options.fusions = config_.fusions;
  if (!config_.token_file.empty()) {
    auto token = ReadToken(config_.token_file);
    if (!token.ok()) return token.status();
    options.manifest_key = DeriveManifestKey(*token);
    spdlog::info("storage: manifests are {} with HMAC-SHA256 keyed from {}",
                 config_.role == "publish" ? "signed" : "checked", config_.token_file);
  } else {
    spdlog::warn(
        "storage: no token (storage.token_file or tls.token_file): manifests are unsigned, and "
        "anyone who can write {} can publish versions",
        config_.dir);
  }
  if (config_.role == "publish") {
    if (!ValidWriterName(agent_name_)) {
      return absl::InvalidArgumentError(
          absl::StrCat("agent name '", agent_name_,
                       "' names the storage files: use letters, digits, '-' and '_' only"));
    }
    absl::MutexLock lock(&publish_mu_);
    publisher_ = std::make_unique<DeltaPublisher>(options);
    if (auto s = publisher_->Resume(); !s.ok()) return s;
    spdlog::info("storage: publishing versions into {} (anchor every {} versions)", config_.dir,
                 config_.anchor_every);
    return absl::OkStatus();
  }
  subscriber_ = std::make_unique<DeltaSubscriber>(options);
  poller_ = std::thread([this] { PollLoop(); });
  spdlog::info("storage: applying versions from {} every {} ms ({} writer(s) per version)",
               config_.dir, config_.poll_ms, config_.writers);
  return absl::OkStatus();
}

void StorageAgent::Stop() {
  {
    absl::MutexLock lock(&poll_mu_);
    stop_polling_ = true;
  }
  if (poller_.joinable()) poller_.join();
  absl::MutexLock lock(&publish_mu_);  // waits for a publish in progress
  stopped_ = true;
}

absl::StatusOr<std::vector<ShardBuffer>> StorageAgent::Buffers(
    v1::Role role, std::vector<std::shared_ptr<const registry::RegisteredTensor>>* holds) {
  std::vector<ShardBuffer> out;
  const v1::AgentLayout layout = registry_->Layout(agent_name_);
  for (const auto& t : layout.tensors()) {
    if (t.owner().role() != role) continue;
    auto reg = registry_->Find(t.region().region_id());
    if (!reg) continue;  // withdrawn meanwhile
    if (reg->memory.kind != transport::MemoryKind::kHost) {
      return absl::UnimplementedError(
          absl::StrCat("tensor '", reg->spec.name(), "' is in GPU memory (", reg->location,
                       "); the storage path reads and writes host memory only"));
    }
    if (role == v1::ROLE_TRAINER && reg->spec.has_view()) {
      return absl::UnimplementedError(
          absl::StrCat("tensor '", reg->spec.name(), "' is a part of '", reg->spec.view().buffer(),
                       "' (a trainer layout's view); the storage path publishes dense shards only "
                       "(register_hf_shards)"));
    }
    ShardBuffer b;
    b.spec = reg->spec;
    b.rank = reg->owner.rank();
    b.replica = reg->owner.replica();
    b.data = absl::MakeSpan(static_cast<uint8_t*>(reg->memory.addr), reg->memory.length);
    b.id = reg->region_id;
    out.push_back(std::move(b));
    holds->push_back(std::move(reg));
  }
  return out;
}

absl::StatusOr<v1::PublishResult> StorageAgent::Publish(uint64_t version) {
  absl::MutexLock lock(&publish_mu_);
  if (stopped_) return absl::UnavailableError("the agent is shutting down");
  if (!publisher_) {
    return absl::FailedPreconditionError(absl::StrCat("this agent subscribes to ", config_.dir,
                                                      "; publish through an agent with "
                                                      "storage.role: publish"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<const registry::RegisteredTensor>> holds;
  auto sources = Buffers(v1::ROLE_TRAINER, &holds);
  if (!sources.ok()) return sources.status();
  auto r = publisher_->Publish(version, *sources);
  if (!r.ok()) {
    return absl::Status(r.status().code(), absl::StrCat("publishing version ", version, " to ",
                                                        config_.dir, ": ", r.status().message()));
  }
  v1::PublishResult out;
  out.set_version(r->version);
  out.set_anchor(r->anchor);
  out.set_base_version(r->base_version);
  out.set_bytes_written(r->bytes_written);
  out.set_dense_bytes(r->dense_bytes);
  out.set_changed_elements(r->changed_elements);
  for (const auto& f : r->files) out.add_files(f);
  out.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  spdlog::info("storage: published version {} ({}, {} bytes for {} dense) in {:.3f} s", version,
               r->anchor ? "anchor" : absl::StrCat("delta on ", r->base_version), r->bytes_written,
               r->dense_bytes, out.seconds());
  return out;
}

void StorageAgent::PollLoop() {
  SubscriberHooks hooks;
  hooks.begin = events_.begin;
  hooks.commit = [this](uint64_t v) {
    auto s = events_.commit(v);
    if (s.ok()) spdlog::info("storage: committed version {} from {}", v, config_.dir);
    return s;
  };
  hooks.refused = [this](uint64_t v, const std::string& reason) {
    spdlog::error("storage: {}", reason);
    if (events_.abort) events_.abort(v, reason);
  };
  hooks.ignored = [this](const std::string& what) {
    spdlog::warn("storage: ignoring {}/{}", config_.dir, what);
  };
  while (true) {
    {
      absl::MutexLock lock(&poll_mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(poll_mu_) { return stop_polling_; };
      poll_mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(config_.poll_ms));
      if (stop_polling_) return;
    }
    std::vector<std::shared_ptr<const registry::RegisteredTensor>> holds;
    auto destinations = Buffers(v1::ROLE_INFERENCE, &holds);
    if (!destinations.ok()) {
      const std::string problem =
          absl::StrCat("storage: not applying versions: ", destinations.status().message());
      if (problem != last_problem_) spdlog::error("{}", problem);
      last_problem_ = problem;
      continue;
    }
    last_problem_.clear();
    subscriber_->Poll(*destinations, hooks);
  }
}

}  // namespace wb::storage
