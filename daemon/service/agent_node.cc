#include "daemon/service/agent_node.h"

#include <grp.h>
#include <pwd.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc/credentials.h"
#include "common/grpc/message_limits.h"
#include "common/net/socket_util.h"
#include "common/version/version.h"
#include "common/wire/check_failed.h"
#include "daemon/checks/finite_check.h"
#include "daemon/checks/version_digest.h"
#include "daemon/executor/op_bounds.h"
#include "daemon/executor/op_preparer.h"
#include "daemon/gpu/cuda_probe.h"
#include "daemon/service/agent_service.h"
#include "daemon/service/controller_link.h"
#include "daemon/service/memory_opener.h"
#include "daemon/transport/factory.h"
#include "security/call_guard.h"

namespace wb::service {

namespace v1 = weightbeam::v1;

namespace {

std::string HostOf(const std::string& host_port) {
  auto colon = host_port.rfind(':');
  return colon == std::string::npos ? host_port : host_port.substr(0, colon);
}

// True when something accepts connections on the Unix socket at `path`.
bool SocketAlive(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool alive = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return alive;
}

absl::Status NoOtherAgentOn(const std::string& path) {
  if (!SocketAlive(path)) return absl::OkStatus();
  return absl::AlreadyExistsError(
      absl::StrCat("another wb-agent is already serving ", path, "; stop it or set local_socket"));
}

}  // namespace

AgentNode::AgentNode(config::AgentConfig config) : config_(std::move(config)) {
  if (config_.name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    config_.name = host;
  }
  fence_ = std::make_unique<LeaderFence>(config_.name);
}

AgentNode::~AgentNode() { Shutdown(); }

absl::Status AgentNode::CreateTransports() {
  std::vector<std::string> names;
  if (config_.local_enabled) names.push_back("local");
  if (config_.tcp.enabled) names.push_back("tcp");
  if (config_.rdma.enabled) names.push_back("rdma");
  for (const auto& name : names) {
    auto t = transport::MakeTransport(name, config_);
    if (!t.ok()) {
      return absl::Status(t.status().code(),
                          absl::StrCat("transport ", name, ": ", t.status().message()));
    }
    by_name_[name] = t->get();
    transports_.push_back(std::move(*t));
  }
  if (transports_.empty()) return absl::InvalidArgumentError("every transport is disabled");
  return absl::OkStatus();
}

absl::Status AgentNode::BindLocalSocket() {
  const std::string& path = config_.local_socket;
  if (auto s = NoOtherAgentOn(path); !s.ok()) return s;
  unlink(path.c_str());  // a stale socket from an agent that died
  auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) mkdir(path.substr(0, slash).c_str(), 0755);
  // The agent accepts on the socket itself (to learn each caller's credentials from the
  // kernel) and hands every connection to a gRPC server that has no port of its own.
  auto listener = local::UnixListener::Bind(path);
  if (!listener.ok()) return listener.status();
  local_listener_ = std::move(*listener);
  local_service_->SetCredentialLookup(
      [l = local_listener_.get()](const std::string& peer) { return l->Lookup(peer); });
  grpc::ServerBuilder builder;
  builder.RegisterService(local_service_.get());
  builder.SetMaxReceiveMessageSize(kMaxControlMessageBytes);  // large registration batches
  local_server_ = builder.BuildAndStart();
  if (!local_server_) {
    return absl::UnavailableError(absl::StrCat("cannot serve the Local service on ", path));
  }
  local_listener_->Start(local_server_.get());
  if (chmod(path.c_str(), config_.socket_mode) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("chmod ", path, ": ", std::strerror(errno)));
  }
  if (!config_.socket_group.empty()) {
    struct group* g = getgrnam(config_.socket_group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("socket_group '", config_.socket_group, "' does not exist"));
    }
    if (chown(path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          "chown ", path, " to group ", config_.socket_group, ": ", std::strerror(errno)));
    }
  }
  if (!config_.socket_owner.empty()) {
    struct passwd* pw = getpwnam(config_.socket_owner.c_str());
    if (pw == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("socket_owner '", config_.socket_owner, "' does not exist"));
    }
    if (chown(path.c_str(), pw->pw_uid, static_cast<gid_t>(-1)) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          "chown ", path, " to user ", config_.socket_owner, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status AgentNode::StartMetrics() {
  for (auto& t : transports_) {
    t->SetArrivalCallback([this, name = t->Name()](const std::string& peer, uint64_t bytes) {
      metrics_.BytesReceived(name, peer)->Increment(bytes);
    });
    t->SetFenceCallback([this, name = t->Name()](const std::string& peer, uint64_t) {
      metrics_.FencedWrites(name, peer)->Increment();
    });
  }
  metrics_.AddGauges({
      [this] { return static_cast<double>(executor_->ops_in_flight()); },
      [this] { return static_cast<double>(staging_->in_flight()); },
      [this] { return static_cast<double>(registry_->size()); },
      [this] {
        absl::MutexLock lock(&mu_);
        return static_cast<double>(committed_version_);
      },
  });
  if (config_.metrics_listen.empty()) return absl::OkStatus();
  auto exporter = metrics::HttpExporter::Start(config_.metrics_listen, &metrics_registry_);
  if (!exporter.ok()) return exporter.status();
  metrics_exporter_ = std::move(*exporter);
  spdlog::info("metrics on http://{}:{}/metrics", HostOf(config_.metrics_listen),
               metrics_exporter_->port());
  return absl::OkStatus();
}

absl::Status AgentNode::StartStorage() {
  if (config_.storage.dir.empty()) return absl::OkStatus();
  storage::VersionEvents events;
  events.begin = [this](uint64_t v) { return Begin(v); };
  events.commit = [this](uint64_t v) { return Commit(v); };
  events.abort = [this](uint64_t v, const std::string& reason) {
    Publish(v1::Event::KIND_ABORT, v, reason);
  };
  config::StorageConfig storage = config_.storage;
  if (storage.token_file.empty()) storage.token_file = config_.tls.token_file;  // the cluster's
  storage_ = std::make_unique<storage::StorageAgent>(storage, config_.name, registry_.get(),
                                                     std::move(events));
  if (auto s = storage_->Start(); !s.ok()) return s;
  local_service_->SetPublishHandler([this](uint64_t v) { return storage_->Publish(v); });
  return absl::OkStatus();
}

absl::Status AgentNode::Start() {
  if (auto s = CreateTransports(); !s.ok()) return s;
  // Arm every transport's step fence, closed: no write lands until a step begins here.
  for (auto& t : transports_) {
    if (auto s = t->CloseStep(true); !s.ok()) return s;
  }
  std::vector<transport::Transport*> raw;
  for (auto& t : transports_) raw.push_back(t.get());
  registry_ = std::make_unique<registry::RegionRegistry>(raw, OpenMemory);
  if (config_.receive.mode == "staged") {
    mirrors_ = std::make_unique<staging::StagingMirrors>(config_.receive.staging_max_bytes);
    registry_->SetStager(mirrors_.get());
  }
  staging_ = std::make_unique<executor::StagingPool>(config_.executor.staging_watermark_bytes, raw);
  preparer_ = std::make_unique<executor::OpPreparer>();
  executor::ExecutorOptions eopts;
  eopts.prepare_threads = config_.executor.prepare_threads;
  eopts.write_timeout = std::chrono::milliseconds(config_.executor.write_timeout_ms);
  eopts.test_hold_version = config_.executor.test_hold_version;
  eopts.test_hold = std::chrono::milliseconds(config_.executor.test_hold_ms);
  executor_ =
      std::make_unique<executor::Executor>(registry_.get(), staging_.get(), preparer_.get(), eopts);
  // Relay ops forward this agent's destination bytes of the open step once they have landed.
  executor_->SetLandingTracker(&landing_);
  captures_ = std::make_unique<executor::CaptureStore>(
      registry_.get(), 4, std::chrono::milliseconds(config_.capture.test_delay_ms));
  for (auto& t : transports_) {
    t->SetLandingCallback([this](uint64_t step, const void* addr, uint64_t length) {
      landing_.Landed(step, addr, length);
    });
    t->SetPeerEndedCallback([this](const std::string& peer) { landing_.PeerEnded(peer); });
  }
  auto server_credentials = wb::grpcutil::MakeServerCredentials(config_.tls);
  if (!server_credentials.ok()) return server_credentials.status();
  auto channels = wb::grpcutil::ChannelFactory::FromConfig(config_.tls);
  if (!channels.ok()) return channels.status();
  auto guard = security::CallGuard::FromConfig(config_.tls, "agent " + config_.name);
  if (!guard.ok()) return guard.status();
  // tls.server_name names the controller; peers are checked against the host dialled.
  connector_ =
      std::make_unique<PeerConnector>(config_.name, by_name_, channels->WithServerName(""));
  delta::DeltaReceiverOptions delta_options;
  delta_options.fail_commit_version = static_cast<uint64_t>(config_.delta.test_fail_commit_version);
  delta_receiver_ =
      std::make_unique<delta::DeltaReceiver>(config_.name, raw, registry_.get(), delta_options);
  local_service_ = std::make_unique<local::LocalService>(
      registry_.get(), &events_,
      [this](const std::string&) { metrics_.Error(AgentMetrics::kRegistrationRefused); },
      [this] {
        absl::MutexLock lock(&mu_);
        return committed_version_;
      });
  local_service_->SetAckBook(&acks_, mirrors_ != nullptr);
  if (mirrors_) local_service_->SetCheckBook(&check_acks_);
  if (mirrors_) {
    staging::SwapEnvironment env;
    env.destinations = [this] { return registry_->Destinations(); };
    env.publish = [this](const v1::Event& e) { events_.Publish(e); };
    env.commit = [this](uint64_t version) { return Advance(v1::Event::KIND_COMMIT, version); };
    env.staged_objects = [this](std::optional<uid_t> owner) {
      return mirrors_->HostObjects(owner);
    };
    staging::SwapOptions options;
    options.agent = config_.name;
    options.ack_timeout = std::chrono::milliseconds(config_.receive.ack_timeout_ms);
    options.unfinished_wait = options.ack_timeout + std::chrono::seconds(30);
    options.test_delay = std::chrono::milliseconds(config_.receive.test_swap_delay_ms);
    options.test_delay_version = config_.receive.test_swap_delay_version;
    if (options.test_delay.count() > 0) {
      spdlog::warn("agent {}: receive.test_swap_delay_ms {} (a test hook) holds every swap",
                   config_.name, config_.receive.test_swap_delay_ms);
    }
    if (config_.receive.keep_versions > 0) {
      history_ = std::make_unique<staging::VersionHistory>(config_.receive.keep_versions,
                                                           config_.receive.keep_max_bytes);
      env.history = history_.get();
    }
    env.rolled_back = [this](uint64_t version, const std::string& reason) {
      {
        absl::MutexLock lock(&mu_);
        committed_version_ = version;
      }
      Publish(v1::Event::KIND_COMMIT, version, reason);
    };
    swap_ = std::make_unique<staging::StagedSwap>(&acks_, std::move(env), options);
  }
  agent_service_ = std::make_unique<AgentService>(this, *guard);
  if (auto s = StartMetrics(); !s.ok()) return s;
  if (auto s = StartStorage(); !s.ok()) return s;

  // Refuse a second agent on this socket before taking any port, with the clearer message.
  if (auto s = NoOtherAgentOn(config_.local_socket); !s.ok()) return s;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config_.listen, *server_credentials, &agent_port_);
  builder.RegisterService(agent_service_.get());
  builder.SetMaxReceiveMessageSize(kMaxControlMessageBytes);  // plans with millions of ops
  agent_server_ = builder.BuildAndStart();
  if (!agent_server_ || agent_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", config_.listen, " for the Agent service"));
  }
  if (config_.step_link.enabled) {
    auto listen = net::ParseHostPort(config_.listen);
    if (!listen.ok()) return listen.status();
    StepLinkOptions links;
    links.host = listen->host;
    links.port = static_cast<uint16_t>(config_.step_link.port);
    if (auto s = agent_service_->StartStepLinks(links); !s.ok()) return s;
  }
  // The Local socket appears last: once it exists, the Agent service already answers.
  if (auto s = BindLocalSocket(); !s.ok()) return s;
  const std::string incarnation = ControllerLink::RandomIncarnation();
  for (const std::string& address : config::ControllerAddresses(config_.controller)) {
    links_.push_back(std::make_unique<ControllerLink>(
        address, config_.heartbeat_interval_ms, [this] { return Info(); },
        [this] { return Layout(); }, [this] { return registry_->generation(); }, *channels,
        incarnation));
  }
  registry_->SetChangeCallback([this] {
    for (const auto& stats : registry_->RegistrationStats()) {
      metrics_.TransportRegistrations(stats.transport, stats.regions, stats.seconds);
    }
    for (auto& link : links_) link->LayoutChanged();
    if (mirrors_) mirrors_->Forget();  // the mirrors of withdrawn tensors
  });
  for (auto& link : links_) link->Start();
  spdlog::info(
      "wb-agent {} serving: Local on {}, Agent on port {}, step links on port {}, "
      "transports:{}",
      config_.name, config_.local_socket, agent_port_, agent_service_->step_link_port(), [&] {
        std::string s;
        for (auto& t : transports_) s += " " + t->Name();
        return s;
      }());
  return absl::OkStatus();
}

void AgentNode::Shutdown() {
  if (shutting_down_.exchange(true)) return;
  metrics_exporter_.reset();  // its scrapes read the executor and registry torn down below
  if (executor_) executor_->Cancel("agent shutting down");
  if (storage_) storage_->Stop();
  for (auto& link : links_) link->Stop();
  auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  if (local_listener_) local_listener_->Stop();
  if (local_server_) local_server_->Shutdown(deadline);
  if (agent_service_) agent_service_->CloseStepChannels();
  if (agent_server_) agent_server_->Shutdown(deadline);
  unlink(config_.local_socket.c_str());
}

void AgentNode::Wait() {
  if (agent_server_) agent_server_->Wait();
}

v1::AgentInfo AgentNode::Info() const {
  v1::AgentInfo info;
  info.set_name(config_.name);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  info.set_node(host);
  std::string advertise =
      config_.advertise_host.empty() ? HostOf(config_.listen) : config_.advertise_host;
  if (advertise == "0.0.0.0" || advertise.empty()) advertise = "127.0.0.1";
  info.set_control_endpoint(absl::StrCat(advertise, ":", agent_port_));
  for (const auto& t : transports_) {
    for (const auto& nic : t->Nics()) *info.add_nics() = nic;
  }
  info.set_version(wb::version::Number());
  std::string why;
  info.set_supports_gpu_memory(GpuMemorySupported(&why));
  if (mirrors_) info.set_commit_wait_ms(config_.receive.ack_timeout_ms);
  for (const auto& g : gpu::ProbeGpus().gpus) *info.add_gpus() = g;
  return info;
}

v1::AgentLayout AgentNode::Layout() const { return registry_->Layout(config_.name); }

absl::Status AgentNode::CheckStagingFits(uint64_t plan_id) {
  if (!mirrors_) return absl::OkStatus();
  uint64_t unstaged = 0, tensors = 0;
  for (const auto& t : registry_->Destinations()) {
    if (t->staged) continue;
    unstaged += t->memory.length;
    ++tensors;
  }
  if (tensors == 0) return absl::OkStatus();
  metrics_.Error(AgentMetrics::kPlanLoadFailed);
  return absl::ResourceExhaustedError(absl::StrCat(
      "plan ", plan_id, ": agent ", config_.name, " (receive.mode staged) needs at least ",
      mirrors_->staged_bytes() + unstaged, " bytes of staging memory (", mirrors_->staged_bytes(),
      " held, ", unstaged, " more for ", tensors,
      " destination tensor(s) that did not fit) but receive.staging_max_bytes is ",
      mirrors_->budget_bytes(), "; raise it, or use receive.mode in_place"));
}

absl::Status AgentNode::CheckRelayNeverSends(const v1::AgentPlan& plan) const {
  const v1::TransferOp* relay = nullptr;
  const v1::TransferOp* own = nullptr;
  for (const auto& op : plan.ops()) {
    (op.relay() ? relay : own) = &op;
    if (relay && own) break;
  }
  if (!relay || !own) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "plan ", plan.plan_id(), " makes agent ", config_.name, " a relay (op ", relay->op_id(),
      " forwards ", relay->src_tensor(), ") and a sender of its own bytes (op ", own->op_id(), ", ",
      own->src_tensor(), "); a relay never sends: refusing the plan"));
}

absl::Status AgentNode::LoadPlan(v1::AgentPlan plan, v1::LoadPlanResponse* resp) {
  if (auto s = CheckStagingFits(plan.plan_id()); !s.ok()) return s;
  if (plan.delta_receive()) {
    auto s = delta_receiver_->Load(plan, resp);
    if (!s.ok()) metrics_.Error(AgentMetrics::kPlanLoadFailed);
    return s;
  }
  // Relay ops wait for their bytes to be seen landing: a transport that could carry them here
  // without reporting them landed would make the relay wait out every step's deadline. Every
  // built-in transport reports landings (rdma through its landing notices); the check stays for
  // any that does not.
  if (std::any_of(plan.ops().begin(), plan.ops().end(),
                  [](const v1::TransferOp& op) { return op.relay(); })) {
    for (const auto& t : transports_) {
      if (!t->caps().reports_landing) {
        metrics_.Error(AgentMetrics::kPlanLoadFailed);
        return absl::FailedPreconditionError(absl::StrCat(
            "plan ", plan.plan_id(), " makes agent ", config_.name, " a relay, but its ", t->Name(),
            " transport does not report landed writes (relays need a transport that does "
            "into the relay; disable relays in the controller's config or ",
            t->Name(), " on this agent)"));
      }
    }
  }
  // Every op is checked against this agent's own regions before the plan is kept (and again
  // per step, when the executor resolves the region).
  for (const auto& op : plan.ops()) {
    auto source = registry_->Find(op.src_region());
    if (!source) continue;  // gone meanwhile: the step fails naming it
    if (auto s = executor::CheckSourceOp(op, source->memory.length); !s.ok()) {
      metrics_.Error(AgentMetrics::kPlanLoadFailed);
      return absl::InvalidArgumentError(absl::StrCat("plan ", plan.plan_id(), ": op ", op.op_id(),
                                                     " (", op.src_tensor(), "): ", s.message()));
    }
  }
  // A relay never sends bytes of its own (issue 41, item 6): the skips of a sender's fallback
  // ops (their relay is in the step) would apply to its relay ops too, and its children would
  // commit a version with none of its bytes. The planner never makes such a plan; refuse one.
  if (auto s = CheckRelayNeverSends(plan); !s.ok()) {
    metrics_.Error(AgentMetrics::kPlanLoadFailed);
    return s;
  }
  // The ops leave the plan (kept below without them) as they were parsed: a swap of pointers,
  // no copy or move of 10^6 messages. The executor holds the only list of them.
  // A new plan discards the captures of the old one; one that cannot be captured within the
  // budget is refused (capture.max_bytes), never loaded to read in place instead.
  auto capture_bytes =
      captures_->Load(plan.ops(), config_.capture.max_bytes,
                      absl::StrCat("plan ", plan.plan_id(), " on agent ", config_.name));
  if (!capture_bytes.ok()) {
    metrics_.Error(AgentMetrics::kPlanLoadFailed);
    return capture_bytes.status();
  }
  resp->set_capture_bytes(*capture_bytes);
  resp->set_capture_slots(captures_->slots());
  // Fallback ops' destinations (relays): fed only in a step whose relay for them was dropped,
  // so connected only then.
  std::set<std::string> fallback_peers;
  for (const auto& op : plan.ops()) {
    if (op.fallback()) fallback_peers.insert(op.dst_agent());
  }
  auto ops = std::make_shared<executor::OpList>();
  ops->Swap(plan.mutable_ops());
  executor::SortByPhase(ops.get());
  if (auto s = ConnectAndLoad(plan, ops, fallback_peers); !s.ok()) return s;
  std::set<std::string> now;
  for (const auto& p : plan.peers()) now.insert(p.agent());
  std::vector<std::string> dropped;
  absl::MutexLock lock(&mu_);
  for (const auto& p : plan_.peers()) {
    if (!now.count(p.agent())) dropped.push_back(p.agent());
  }
  // Peers the new plan no longer writes to: close our connections and forget their keys.
  for (const auto& peer : dropped) {
    for (auto& t : transports_) t->ForgetPeer(peer, transport::PeerSide::kOutgoing);
  }
  if (!dropped.empty()) {
    spdlog::info("plan {}: closed the connections to {} peer(s) no longer in the plan: {}",
                 plan.plan_id(), dropped.size(), absl::StrJoin(dropped, ", "));
  }
  plan_ = std::move(plan);
  plan_id_ = plan_.plan_id();
  fallback_peers_ = std::move(fallback_peers);
  reconnect_ = false;
  delta_sending_ = plan_.delta().enabled() && config_.delta.shadow == "host";
  spdlog::info("loaded plan {}: {} ops to {} peer(s)", plan_.plan_id(), ops->size(),
               plan_.peers_size());
  return absl::OkStatus();
}

absl::Status AgentNode::ConnectAndLoad(const v1::AgentPlan& plan,
                                       std::shared_ptr<const executor::OpList> ops,
                                       const std::set<std::string>& skip) {
  std::vector<const v1::PeerIntro*> peers;
  for (const auto& p : plan.peers()) {
    if (!skip.count(p.agent())) peers.push_back(&p);
  }
  auto routes = connector_->Connect(peers);
  if (!routes.ok()) {
    metrics_.Error(AgentMetrics::kPlanLoadFailed);
    return routes.status();
  }
  for (auto& [agent, route] : *routes) {
    route.bytes_sent = metrics_.BytesSent(route.transport->Name(), agent);
  }
  std::shared_ptr<delta::DeltaSender> delta;
  if (plan.delta().enabled() && config_.delta.shadow == "host") {
    // The delta state is built from the whole plan: a copy with its ops, delta mode only.
    v1::AgentPlan whole = plan;
    whole.mutable_ops()->Reserve(static_cast<int>(ops->size()));
    for (const auto& op : *ops) *whole.add_ops() = op;
    delta = std::make_shared<delta::DeltaSender>(whole, config_.executor.prepare_threads,
                                                 config_.delta.gpu_shadow == "host"
                                                     ? delta::ShadowPlacement::kHostMapped
                                                     : delta::ShadowPlacement::kDevice);
  }
  executor_->Load(std::move(ops), std::move(*routes), std::move(delta));
  absl::MutexLock lock(&mu_);
  unconnected_ = skip;
  return absl::OkStatus();
}

v1::AgentStepReport AgentNode::Capture(const v1::ExecuteRequest& req) {
  v1::AgentStepReport report;
  report.set_agent(config_.name);
  {
    absl::MutexLock lock(&mu_);
    if (req.plan_id() != plan_id_) {
      report.set_error(absl::StrCat("capture of version ", req.version(), ": plan ", req.plan_id(),
                                    " is not loaded (agent has plan ", plan_id_, ")"));
      return report;
    }
  }
  // The capture ends by the deadline the controller gives (the step's), and an abort of its
  // step (by step id) stops it.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(req.timeout_ms() ? req.timeout_ms() : 60000);
  if (auto s =
          captures_->Capture(req.version(), req.capture_slot(), &report, req.step_id(), deadline);
      !s.ok()) {
    report.set_error(absl::StrCat("capture of version ", req.version(), ": ", s.message()));
    return report;
  }
  report.set_ok(true);
  return report;
}

v1::AgentStepReport AgentNode::Execute(const v1::ExecuteRequest& req) {
  if (req.capture_only() && req.from_capture()) {
    v1::AgentStepReport refused;
    refused.set_agent(config_.name);
    refused.set_error("an execute is capture_only or from_capture, not both");
    return refused;
  }
  if (req.capture_only()) return Capture(req);
  v1::AgentStepReport failed;
  failed.set_agent(config_.name);
  bool reconnect = false;
  v1::AgentPlan plan;
  std::set<std::string> skip(req.skip_agents().begin(), req.skip_agents().end());
  delta::StepDelta step;
  {
    absl::MutexLock lock(&mu_);
    // Fallback ops run only to the destinations the controller names (their relay was
    // dropped from this step).
    const std::set<std::string> direct(req.direct_agents().begin(), req.direct_agents().end());
    for (const auto& peer : fallback_peers_) {
      if (!direct.count(peer)) skip.insert(peer);
    }
    if (req.plan_id() != plan_id_) {
      // No plan at all: this process started after the plan was made (a restart); the
      // controller plans again once it has registered.
      failed.set_error(
          plan_id_ == 0
              ? absl::StrCat("has no plan loaded (it started after plan ", req.plan_id(),
                             " was made: restarted?); the next plan after it registers loads one")
              : absl::StrCat("plan ", req.plan_id(), " is not loaded (agent has plan ", plan_id_,
                             ")"));
      metrics_.Error(AgentMetrics::kStepFailed);
      return failed;
    }
    state_ = v1::AGENT_ACTIVITY_EXECUTING;
    // Connect again after a failure, or when this step needs a peer left out before.
    reconnect = reconnect_;
    for (const auto& peer : unconnected_) reconnect = reconnect || !skip.count(peer);
    if (reconnect) plan = plan_;  // without its ops: those stay in the executor
    step.enabled = delta_sending_;
    step.anchor = req.delta_anchor();
    step.verify = plan_.delta().verify();
    step.nonce = req.step_nonce();
  }
  // A failed step may have left connections broken (a peer restarted, a link went down):
  // connect afresh before trying again, so the step can succeed once the cause is gone.
  if (reconnect) {
    if (auto s = ConnectAndLoad(plan, executor_->ops(), skip); !s.ok()) {
      failed.set_error(absl::StrCat("reconnecting to peers: ", s.message()));
      metrics_.Error(AgentMetrics::kStepFailed);
      absl::MutexLock lock(&mu_);
      state_ = v1::AGENT_ACTIVITY_IDLE;
      return failed;
    }
  }
  std::shared_ptr<const executor::CapturedSources> captured;
  if (req.from_capture()) {
    auto sources = captures_->BeginSend(req.version(), req.capture_slot());
    if (!sources.ok()) {
      failed.set_error(std::string(sources.status().message()));
      metrics_.Error(AgentMetrics::kStepFailed);
      absl::MutexLock lock(&mu_);
      state_ = v1::AGENT_ACTIVITY_IDLE;
      return failed;
    }
    captured = std::move(*sources);
  }
  auto timeout = std::chrono::milliseconds(req.timeout_ms() ? req.timeout_ms() : 60000);
  v1::AgentStepReport report = executor_->Execute(
      req.version(), timeout, step, skip, req.step_id(), captured,
      {req.feeders().begin(), req.feeders().end()},
      executor::TensorFilter({req.only_tensors().begin(), req.only_tensors().end()},
                             {req.skip_tensors().begin(), req.skip_tensors().end()}));
  if (req.from_capture()) captures_->EndSend(req.capture_slot());
  report.set_agent(config_.name);
  for (auto& h : *report.mutable_hashes()) h.set_src_agent(config_.name);
  metrics_.StepFinished(report.seconds(), report.ok());
  absl::MutexLock lock(&mu_);
  reconnect_ = !report.ok();
  state_ = v1::AGENT_ACTIVITY_IDLE;
  return report;
}

absl::Status AgentNode::CheckNewer(uint64_t version) {
  absl::MutexLock lock(&mu_);
  if (version <= committed_version_) {
    metrics_.Error(AgentMetrics::kCommitRefused);
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", version, " is not newer than the committed version ", committed_version_));
  }
  return absl::OkStatus();
}

absl::Status AgentNode::BeginStep(uint64_t version, uint64_t step_id, uint64_t plan_id) {
  if (auto s = CheckNewer(version); !s.ok()) return s;
  // A version prepared and never announced nor aborted (the controller lost it, or restarted):
  // the next step supersedes it.
  WithdrawPrepared(absl::StrCat("superseded by version ", version, " before it was announced"));
  {
    absl::MutexLock lock(&mu_);
    if (plan_id != 0 && plan_id != introduced_plan_) {
      // Its senders would be refused at the handshake: say so now, naming the cause, so the
      // controller drops this receiver from the step instead of failing the senders.
      metrics_.Error(AgentMetrics::kCommitRefused);
      return absl::FailedPreconditionError(absl::StrCat(
          "agent ", config_.name, " was not introduced to plan ", plan_id,
          introduced_plan_ == 0 ? " (it has no plan: restarted since?)"
                                : absl::StrCat(" (it knows plan ", introduced_plan_, ")"),
          "; the next plan after it registers includes it"));
    }
  }
  {
    absl::MutexLock fence(&fence_mu_);
    // Staged: waits for (or refuses) an unfinished swap, and restores unswapped mirrors.
    if (swap_) {
      if (auto s = swap_->BeforeStep(version); !s.ok()) {
        metrics_.Error(AgentMetrics::kCommitRefused);
        return s;
      }
    }
    // From here on only this step's writes land; writes of an older step (aborted, timed out)
    // still landing are cut and waited for before the controller hears that we began.
    for (auto& t : transports_) {
      if (auto s = t->OpenStep(step_id); !s.ok()) {
        return absl::UnavailableError(absl::StrCat(
            "agent ", config_.name, ": step fence of version ", version, ": ", s.message()));
      }
    }
    // Landings are tracked only where relay ops wait for them (step 0: none tracked); opened
    // before the controller hears we began, so no write of this step has landed yet.
    landing_.Open(executor_->has_relays() ? step_id : 0);
    absl::MutexLock lock(&mu_);
    step_open_ = true;
    open_step_ = step_id;
    open_version_ = version;
    begun_at_ = std::chrono::steady_clock::now();
    // Staged: the engine keeps serving; begin(v) is announced at the swap.
    if (swap_) return absl::OkStatus();
  }
  return Advance(v1::Event::KIND_BEGIN, version);
}

absl::Status AgentNode::CloseFenceForCommit(uint64_t version, uint64_t step_id) {
  absl::MutexLock fence(&fence_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (!step_open_ || open_step_ != step_id || open_version_ != version) {
      metrics_.Error(AgentMetrics::kCommitRefused);
      return absl::FailedPreconditionError(absl::StrCat(
          "agent ", config_.name, ": version ", version,
          " is not the step open here (aborted, timed out or never begun); refusing to commit"));
    }
  }
  uint64_t refused = 0;
  for (auto& t : transports_) refused += t->RefusedWrites(step_id);
  const bool clean = refused == 0;
  absl::Status closed;
  for (auto& t : transports_) {
    if (auto s = t->CloseStep(clean); !s.ok() && closed.ok()) closed = s;
  }
  {
    absl::MutexLock lock(&mu_);
    step_open_ = false;
  }
  if (!clean) {
    metrics_.Error(AgentMetrics::kCommitRefused);
    return absl::FailedPreconditionError(
        absl::StrCat("agent ", config_.name, ": ", refused, " write(s) of version ", version,
                     " were refused by the step fence; refusing to commit"));
  }
  if (!closed.ok()) {
    metrics_.Error(AgentMetrics::kCommitRefused);
    return absl::UnavailableError(
        absl::StrCat("agent ", config_.name, ": step fence: ", closed.message()));
  }
  return absl::OkStatus();
}

absl::Status AgentNode::CommitStep(uint64_t version, uint64_t step_id) {
  v1::CommitRequest req;
  req.set_version(version);
  req.set_step_id(step_id);
  return CommitStep(req);
}

bool AgentNode::CommitMayWait(const v1::CommitRequest& req) const {
  return mirrors_ != nullptr || (req.step_nonce() != 0 && !req.announce());
}

absl::Status AgentNode::CommitStep(const v1::CommitRequest& req, v1::CommitResponse* resp) {
  if (req.announce()) {
    KeepDigests(req);
    return Announce(req.version(), req.step_id(), resp);
  }
  if (auto s = CheckNewer(req.version()); !s.ok()) return s;
  if (auto s = CloseFenceForCommit(req.version(), req.step_id()); !s.ok()) return s;
  return Conclude(req, resp);
}

absl::Status AgentNode::Conclude(const v1::CommitRequest& req, v1::CommitResponse* resp) {
  if (auto s = CheckVersion(req, resp); !s.ok()) return s;
  if (!req.prepare()) {
    if (auto s = AnnounceCommit(req.version(), resp); !s.ok()) return s;
    if (req.delta_base_version() == 0 && swap_) swap_->ClearStale();  // rewritten whole
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  prepared_dense_ = req.delta_base_version() == 0;
  if (req.version() <= committed_version_) {
    metrics_.Error(AgentMetrics::kCommitRefused);
    return absl::FailedPreconditionError(absl::StrCat("version ", req.version(),
                                                      " is not newer than the committed version ",
                                                      committed_version_));
  }
  prepared_ = true;
  prepared_step_ = req.step_id();
  prepared_version_ = req.version();
  return absl::OkStatus();
}

absl::Status AgentNode::CheckVersion(const v1::CommitRequest& req, v1::CommitResponse* resp) {
  if (req.checks().digest() && resp != nullptr) {
    auto digests = checks::DigestDestinations(registry_->Destinations());
    if (!digests.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("agent ", config_.name, ": version ",
                                                        req.version(),
                                                        ": digest: ", digests.status().message()));
    }
    for (auto& d : *digests) *resp->add_digests() = std::move(d);
  }
  if (auto s = RunUserCheck(req); !s.ok()) return s;
  if (!req.checks().finite()) return absl::OkStatus();
  checks::FiniteStats stats;
  const absl::Status s = checks::CheckFinite(registry_->Destinations(), &stats);
  const double gbps = stats.seconds > 0 ? stats.bytes / stats.seconds / 1e9 : 0;
  if (!s.ok()) return CheckRefused(req.version(), s.message());
  spdlog::info(
      "version {}: {} destination tensor(s), {} bytes finite (checked in {:.3f} s, "
      "{:.2f} GB/s)",
      req.version(), stats.tensors, stats.bytes, stats.seconds, gbps);
  return absl::OkStatus();
}

absl::Status AgentNode::CheckRefused(uint64_t version, absl::string_view why) {
  metrics_.Error(AgentMetrics::kCommitRefused);
  spdlog::error("agent {}: version {}: {}", config_.name, version, std::string(why));
  return absl::FailedPreconditionError(absl::StrCat("agent ", config_.name, ": version ", version,
                                                    " ", wire::kCheckFailed, ": ", why));
}

absl::Status AgentNode::RunUserCheck(const v1::CommitRequest& req) {
  if (!req.checks().user()) return absl::OkStatus();
  if (!mirrors_) {
    return CheckRefused(req.version(),
                        "a user check needs receive.mode staged here (this agent writes in "
                        "place, so the version would be live before it was checked)");
  }
  staging::UserCheckEnvironment env;
  env.destinations = [this] { return registry_->Destinations(); };
  env.publish = [this](const v1::Event& e) { events_.Publish(e); };
  env.staged_objects = [this](std::optional<uid_t> owner) { return mirrors_->HostObjects(owner); };
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = staging::RunUserCheck(&check_acks_, env, req.version(),
                                         wire::UserCheckDeadline(req.checks()));
  if (!s.ok()) return CheckRefused(req.version(), s.message());
  spdlog::info("version {}: user check passed in {:.3f} s", req.version(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return absl::OkStatus();
}

absl::Status AgentNode::Announce(uint64_t version, uint64_t step_id, v1::CommitResponse* resp) {
  bool dense = false;
  {
    absl::MutexLock lock(&mu_);
    if (!prepared_ || prepared_version_ != version || prepared_step_ != step_id) {
      metrics_.Error(AgentMetrics::kCommitRefused);
      return absl::FailedPreconditionError(
          absl::StrCat("agent ", config_.name, ": version ", version,
                       " was not prepared here (aborted since, or never committed); refusing "
                       "to announce it"));
    }
    prepared_ = false;
    dense = prepared_dense_;
  }
  if (auto s = AnnounceCommit(version, resp); !s.ok()) return s;
  if (dense && swap_) swap_->ClearStale();  // rewritten whole
  return absl::OkStatus();
}

absl::Status AgentNode::AnnounceCommit(uint64_t version, v1::CommitResponse* resp) {
  v1::CommitResponse unused;
  if (resp == nullptr) resp = &unused;
  if (!mirrors_) {
    {
      absl::MutexLock lock(&mu_);
      resp->set_live_write_seconds(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - begun_at_).count());
    }
    return Advance(v1::Event::KIND_COMMIT, version);
  }
  resp->set_staged(true);
  if (auto s = CheckNewer(version); !s.ok()) return s;
  absl::Status swapped = swap_->Swap(version, resp);
  if (!swapped.ok()) metrics_.Error(AgentMetrics::kCommitRefused);
  return swapped;
}

void AgentNode::WithdrawPrepared(const std::string& reason) {
  uint64_t withdrawn = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!prepared_) return;
    prepared_ = false;
    withdrawn = prepared_version_;
  }
  Publish(v1::Event::KIND_ABORT, withdrawn, reason);
}

absl::Status AgentNode::Advance(v1::Event::Kind kind, uint64_t version) {
  {
    absl::MutexLock lock(&mu_);
    if (version <= committed_version_) {
      metrics_.Error(AgentMetrics::kCommitRefused);
      return absl::FailedPreconditionError(absl::StrCat(
          "version ", version, " is not newer than the committed version ", committed_version_));
    }
    if (kind == v1::Event::KIND_COMMIT) committed_version_ = version;
  }
  Publish(kind, version, "");
  return absl::OkStatus();
}

void AgentNode::Publish(v1::Event::Kind kind, uint64_t version, const std::string& reason) {
  v1::Event e;
  e.set_kind(kind);
  e.set_version(version);
  e.set_reason(reason);
  if (kind == v1::Event::KIND_COMMIT) {
    absl::MutexLock lock(&mu_);
    if (digests_version_ == version) {
      for (const auto& d : digests_) *e.add_digests() = d;
    }
  }
  events_.Publish(e);
}

void AgentNode::KeepDigests(const v1::CommitRequest& req) {
  absl::MutexLock lock(&mu_);
  digests_version_ = req.version();
  digests_.assign(req.replica_digests().begin(), req.replica_digests().end());
}

absl::Status AgentNode::Begin(uint64_t version) {
  if (!mirrors_) return Advance(v1::Event::KIND_BEGIN, version);
  // Staged: the storage path writes the version into the staging mirrors (the registry's
  // memory); begin(v) is announced at the swap.
  if (auto s = CheckNewer(version); !s.ok()) return s;
  absl::MutexLock fence(&fence_mu_);
  return swap_->BeforeStep(version);
}

absl::Status AgentNode::Commit(uint64_t version) { return AnnounceCommit(version, nullptr); }

absl::Status AgentNode::Commit(const v1::CommitRequest& req, v1::CommitResponse* resp) {
  if (req.announce()) {
    KeepDigests(req);
    return Announce(req.version(), req.step_id(), resp);
  }
  {
    absl::MutexLock lock(&mu_);
    if (req.version() <= committed_version_) {
      metrics_.Error(AgentMetrics::kCommitRefused);
      return absl::FailedPreconditionError(absl::StrCat("version ", req.version(),
                                                        " is not newer than the committed version ",
                                                        committed_version_));
    }
    // Deltas patch the version they were computed against; any other base ends up wrong.
    if (req.delta_base_version() != 0 && req.delta_base_version() != committed_version_) {
      metrics_.Error(AgentMetrics::kCommitRefused);
      return absl::FailedPreconditionError(absl::StrCat(
          "delta mode on agent ", config_.name, ": the deltas of version ", req.version(),
          " apply on version ", req.delta_base_version(), " but this agent holds version ",
          committed_version_, "; refusing them (the next anchor brings it up to date)"));
    }
    if (req.delta_base_version() != 0 && swap_ && swap_->stale()) {
      metrics_.Error(AgentMetrics::kCommitRefused);
      return absl::FailedPreconditionError(
          absl::StrCat("delta mode on agent ", config_.name,
                       ": its staging memory holds bytes of an aborted "
                       "version that could not be restored; refusing deltas of version ",
                       req.version(), " (the next anchor brings it up to date)"));
    }
  }
  if (auto s = CloseFenceForCommit(req.version(), req.step_id()); !s.ok()) return s;
  delta::ApplyStats stats;
  std::vector<v1::OpHash> expected(req.expected_hashes().begin(), req.expected_hashes().end());
  if (auto s = delta_receiver_->Apply(req.version(), req.step_nonce(), expected, &stats); !s.ok()) {
    metrics_.Error(AgentMetrics::kCommitRefused);
    return absl::Status(s.code(),
                        absl::StrCat("delta mode on agent ", config_.name, ": ", s.message()));
  }
  spdlog::info("version {}: applied {} delta slot(s), {} bytes patching {} bytes in {:.3f} s{}",
               req.version(), stats.slots_applied, stats.payload_bytes, stats.dense_bytes,
               stats.seconds, expected.empty() ? "" : ", destinations verified");
  // A relay's bytes of this step are final now: its relay ops, run after this prepare
  // (controller/step_protocol.cc, delta mode with relays), forward them without waiting.
  landing_.LandAll(req.step_id());
  return Conclude(req, resp);
}

absl::Status AgentNode::Abort(uint64_t version, const std::string& reason, uint64_t step_id,
                              bool receiving_only, bool* already_committed) {
  // Sending side: the step's executor stops, and its batches not yet on the wire are dropped;
  // the next step connects afresh (the receivers may have cut this step's connections). Not
  // when only this agent's replica left the step: it sends in the step's next attempt.
  if (!receiving_only) {
    executor_->Cancel(step_id, reason);
    captures_->Discard(version, step_id);  // a capture of the step is never sent now
  }
  {
    absl::MutexLock fence(&fence_mu_);
    bool close = false;
    {
      absl::MutexLock lock(&mu_);
      reconnect_ = true;
      close = step_open_ && (step_id != 0 ? open_step_ == step_id : open_version_ == version);
      if (close) step_open_ = false;
    }
    // Receiving side: none of the step's writes lands once this returns.
    for (auto& t : transports_) {
      if (!close) break;
      if (auto s = t->CloseStep(false); !s.ok()) {
        spdlog::error("aborting version {}: {} step fence: {}", version, t->Name(),
                      std::string(s.message()));
      }
    }
  }
  {
    // A prepared version is withdrawn: its watchers get the abort below, never the commit.
    absl::MutexLock lock(&mu_);
    if (prepared_ && (step_id != 0 ? prepared_step_ == step_id : prepared_version_ == version)) {
      prepared_ = false;
    }
  }
  // Staged: the swap unit tells the watchers: a swap in progress stops (waiting for its
  // watchers) or finishes first (copying), and then the abort is refused.
  if (swap_ &&
      swap_->Abort(version, reason) == staging::StagedSwap::AbortOutcome::kAlreadyCommitted) {
    spdlog::warn(
        "agent {}: abort of version {} came after its staged swap finished: the "
        "version is live here; not aborted",
        config_.name, version);
    if (already_committed != nullptr) *already_committed = true;
    return absl::OkStatus();
  }
  if (swap_) return absl::OkStatus();
  Publish(v1::Event::KIND_ABORT, version, reason);
  return absl::OkStatus();
}

absl::Status AgentNode::Rollback(const v1::RestoreVersionRequest& req,
                                 v1::RestoreVersionResponse* resp) {
  if (!swap_ || !history_) {
    return absl::FailedPreconditionError(
        absl::StrCat("agent ", config_.name,
                     ": rollback needs receive.mode staged and receive.keep_versions "
                     "> 0 (this agent keeps no versions)"));
  }
  for (uint64_t v : history_->Kept()) resp->add_kept(v);
  resp->set_from_version(swap_->live_version());
  if (req.check_only()) {
    if (req.version() == swap_->live_version()) return absl::OkStatus();
    for (uint64_t v : history_->Kept()) {
      if (v == req.version()) return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat("agent ", config_.name, ": version ", req.version(),
                                            " is not kept here (kept: ", history_->KeptText(),
                                            ")"));
  }
  absl::MutexLock fence(&fence_mu_);  // never while a step's Begin moves the fence
  uint64_t from = 0;
  absl::Status s = swap_->Rollback(req.version(), &from);
  resp->set_from_version(from);
  resp->clear_kept();
  for (uint64_t v : history_->Kept()) resp->add_kept(v);
  return s;
}

v1::HealthResponse AgentNode::Health(uint64_t step_id) const {
  v1::HealthResponse h;
  absl::MutexLock lock(&mu_);
  h.set_step_open(step_id != 0 && step_open_ && open_step_ == step_id);
  h.set_serving(!shutting_down_);
  h.set_state(shutting_down_ ? v1::AGENT_ACTIVITY_DRAINING : state_);
  h.set_committed_version(committed_version_);
  if (!links_.empty()) {
    bool registered = false;
    for (const auto& link : links_) registered = registered || link->registered();
    if (!registered) h.add_problems("not registered with the controller");
    // Every link proves the same process: the first one's digest stands for all.
    h.set_incarnation_digest(links_.front()->incarnation_digest());
  }
  for (const auto& stats : registry_->RegistrationStats()) {
    auto* r = h.add_registrations();
    r->set_transport(stats.transport);
    r->set_regions(stats.regions);
    r->set_registered(stats.registered);
    r->set_seconds(stats.seconds);
  }
  return h;
}

absl::StatusOr<std::string> AgentNode::Handshake(const v1::HandshakeRequest& req) {
  auto it = by_name_.find(req.transport());
  if (it == by_name_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("transport ", req.transport(), " is not enabled on agent ", config_.name));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!introduced_.count(req.from_agent())) {
      return absl::PermissionDeniedError(absl::StrCat(
          "agent '", req.from_agent(), "' was not introduced by the controller (agent ",
          config_.name, " expects handshakes only from the current plan's senders)"));
    }
  }
  return it->second->Accept(req.from_agent(), req.record());
}

absl::Status AgentNode::Introduce(uint64_t plan_id, const std::vector<std::string>& senders) {
  // A receiver of the plan: its staging must hold every destination (plans load after this).
  if (!senders.empty()) {
    if (auto s = CheckStagingFits(plan_id); !s.ok()) return s;
  }
  std::vector<std::string> dropped;
  {
    absl::MutexLock lock(&mu_);
    std::set<std::string> now(senders.begin(), senders.end());
    for (const auto& old : introduced_) {
      if (!now.count(old)) dropped.push_back(old);
    }
    introduced_ = std::move(now);
    introduced_plan_ = plan_id;
  }
  // A sender left out of the new plan must not keep writing with what it was given before.
  for (const auto& peer : dropped) {
    for (auto& t : transports_) t->ForgetPeer(peer, transport::PeerSide::kIncoming);
  }
  spdlog::info("plan {}: {} sender(s) introduced{}", plan_id, senders.size(),
               dropped.empty() ? "" : absl::StrCat(", ", dropped.size(), " disconnected"));
  return absl::OkStatus();
}

}  // namespace wb::service
