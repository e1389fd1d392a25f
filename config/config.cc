#include "config/config.h"

#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "config/yaml_reader.h"

namespace wb::config {
namespace {

const std::vector<std::string> kLogLevels = {"trace", "debug", "info", "warn", "error", "off"};

void ReadTls(YamlReader r, TlsConfig* tls) {
  r.ReadBool("enabled", &tls->enabled);
  r.ReadString("cert_file", &tls->cert_file);
  r.ReadString("key_file", &tls->key_file);
  r.ReadString("ca_file", &tls->ca_file);
  r.ReadBool("require_client_cert", &tls->require_client_cert);
  r.ReadString("token_file", &tls->token_file);
  r.ReadString("server_name", &tls->server_name);
  r.ReadString("controller_identity", &tls->controller_identity);
  if (tls->enabled && (tls->cert_file.empty() || tls->key_file.empty())) {
    r.Error("cert_file", "cert_file and key_file when tls.enabled is true", "none");
  }
  if (tls->require_client_cert && tls->ca_file.empty()) {
    r.Error("ca_file", "a CA file when require_client_cert is true", "none");
  }
  r.RejectUnknownKeys();
}

// `renames` and `fusions` under `r` (the controller's top level, or an agent's `storage`).
// Without a `fusions` key the default fusions apply.
void ReadNameRules(YamlReader& r, std::vector<RenameRule>* renames,
                   std::vector<FusionRule>* fusions) {
  for (YamlReader& item : r.ChildList("renames")) {
    RenameRule rule;
    if (item.Require("pattern")) item.ReadString("pattern", &rule.pattern);
    if (item.Require("replacement")) item.ReadString("replacement", &rule.replacement);
    try {
      std::regex re(rule.pattern);
    } catch (const std::regex_error& e) {
      item.Error("pattern", "a regular expression", absl::StrCat("'", rule.pattern, "'"));
    }
    item.RejectUnknownKeys();
    renames->push_back(rule);
  }
  *fusions = DefaultFusionRules();
  if (r.Has("fusions")) {
    fusions->clear();
    for (YamlReader& item : r.ChildList("fusions")) {
      FusionRule rule;
      if (item.Require("fused")) item.ReadString("fused", &rule.fused);
      if (item.Require("parts")) item.ReadStringList("parts", &rule.parts);
      item.ReadInt("dim", 0, 7, &rule.dim);
      if (item.Has("parts") && rule.parts.size() < 2) {
        item.Error("parts", "at least two part names", absl::StrCat(rule.parts.size(), " names"));
      }
      item.RejectUnknownKeys();
      fusions->push_back(rule);
    }
  }
}

void ReadStorage(YamlReader r, StorageConfig* st) {
  r.ReadString("dir", &st->dir);
  r.ReadEnum("role", {"publish", "subscribe"}, &st->role);
  r.ReadInt("anchor_every", 1, 1000000, &st->anchor_every);
  r.ReadBool("prune", &st->prune);
  r.ReadUint32("poll_ms", 1, 600000, &st->poll_ms);
  r.ReadInt("writers", 1, 100000, &st->writers);
  r.ReadString("token_file", &st->token_file);
  ReadNameRules(r, &st->renames, &st->fusions);
  if (!st->dir.empty() && st->role.empty()) {
    r.Error("role", "publish or subscribe when storage.dir is set", "none");
  }
  if (st->dir.empty() && r.Has("role")) {
    r.Error("dir", "a directory when storage.role is set", "none");
  }
  r.RejectUnknownKeys();
}

bool ValidHostPort(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  // Accumulate by hand: std::stoul throws on a port with 20+ digits.
  uint32_t port = 0;
  for (size_t i = colon + 1; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    port = port * 10 + static_cast<uint32_t>(s[i] - '0');
    if (port > 65535) return false;
  }
  return true;
}

void CheckHostPort(YamlReader& r, const std::string& key, const std::string& value) {
  if (r.Has(key) && !ValidHostPort(value)) {
    r.Error(key, "host:port", absl::StrCat("'", value, "'"));
  }
}

template <typename T>
absl::StatusOr<T> Finish(const ReadContext& ctx, T value) {
  if (!ctx.errors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid configuration:\n  ", absl::StrJoin(ctx.errors, "\n  ")));
  }
  return value;
}

absl::StatusOr<YAML::Node> ParseYaml(const std::string& yaml, const std::string& source) {
  try {
    return YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": not valid YAML: ", e.msg));
  }
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open configuration file"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The agent's keys (docs/configuration.md).
void ReadAgent(YamlReader& r, AgentConfig& c) {
  r.ReadString("name", &c.name);
  r.ReadEnum("log_level", kLogLevels, &c.log_level);
  r.ReadString("local_socket", &c.local_socket);
  r.ReadMode("socket_mode", &c.socket_mode);
  r.ReadString("socket_group", &c.socket_group);
  r.ReadString("socket_owner", &c.socket_owner);
  r.ReadString("listen", &c.listen);
  CheckHostPort(r, "listen", c.listen);
  r.ReadString("advertise_host", &c.advertise_host);
  r.ReadString("controller", &c.controller);
  if (r.Has("controller")) {
    const auto addresses = ControllerAddresses(c.controller);
    bool valid = !addresses.empty();
    for (const auto& a : addresses) valid = valid && ValidHostPort(a);
    if (!valid) {
      r.Error("controller", "host:port, or a comma-separated list of them",
              absl::StrCat("'", c.controller, "'"));
    }
  }
  r.ReadUint32("heartbeat_interval_ms", 10, 600000, &c.heartbeat_interval_ms);
  r.ReadString("metrics_listen", &c.metrics_listen);
  CheckHostPort(r, "metrics_listen", c.metrics_listen);

  {
    YamlReader l = r.Child("step_link");
    l.ReadBool("enabled", &c.step_link.enabled);
    l.ReadUint32("port", 0, 65535, &c.step_link.port);
    l.RejectUnknownKeys();
  }

  YamlReader transports = r.Child("transports");
  {
    YamlReader t = transports.Child("tcp");
    t.ReadBool("enabled", &c.tcp.enabled);
    t.ReadString("listen", &c.tcp.listen);
    CheckHostPort(t, "listen", c.tcp.listen);
    t.ReadString("advertise_host", &c.tcp.advertise_host);
    t.ReadInt("connections_per_peer", 1, 64, &c.tcp.connections_per_peer);
    t.ReadBytes("max_frame_bytes", 4096, uint64_t{1} << 32, &c.tcp.max_frame_bytes);
    t.ReadInt("handshake_timeout_ms", 100, 600000, &c.tcp.handshake_timeout_ms);
    t.ReadInt("max_unauthenticated_per_source", 1, 1024, &c.tcp.max_unauthenticated_per_source);
    t.ReadDouble("gbps", 0, 10000, &c.tcp.gbps);
    t.RejectUnknownKeys();
  }
  {
    YamlReader t = transports.Child("rdma");
    t.ReadBool("enabled", &c.rdma.enabled);
    t.ReadStringList("devices", &c.rdma.devices);
    t.ReadInt("gid_index", -1, 255, &c.rdma.gid_index);
    t.ReadInt("qps_per_peer", 1, 64, &c.rdma.qps_per_peer);
    t.ReadInt("mtu", 256, 4096, &c.rdma.mtu);
    if (t.Has("mtu") && (c.rdma.mtu & (c.rdma.mtu - 1)) != 0) {
      t.Error("mtu", "one of 256, 512, 1024, 2048, 4096", absl::StrCat(c.rdma.mtu));
    }
    t.ReadInt("send_queue_depth", 16, 16384, &c.rdma.send_queue_depth);
    t.ReadBytes("chunk_bytes", 4096, uint64_t{1} << 31, &c.rdma.chunk_bytes);
    t.RejectUnknownKeys();
  }
  {
    YamlReader t = transports.Child("local");
    t.ReadBool("enabled", &c.local_enabled);
    t.RejectUnknownKeys();
  }
  transports.RejectUnknownKeys();

  YamlReader ex = r.Child("executor");
  ex.ReadBytes("staging_watermark_bytes", 4096, uint64_t{1} << 40,
               &c.executor.staging_watermark_bytes);
  ex.ReadUint32("write_timeout_ms", 10, 3600000, &c.executor.write_timeout_ms);
  ex.ReadInt("prepare_threads", 1, 64, &c.executor.prepare_threads);
  {
    int64_t hold_version = 0;
    ex.ReadInt("test_hold_version", 0, std::numeric_limits<int64_t>::max(), &hold_version);
    c.executor.test_hold_version = static_cast<uint64_t>(hold_version);
  }
  ex.ReadUint32("test_hold_ms", 0, 600000, &c.executor.test_hold_ms);
  ex.RejectUnknownKeys();

  {
    YamlReader tls = r.Child("tls");
    ReadTls(tls, &c.tls);
    // Without the controller's name an agent cannot tell the controller from any other holder
    // of a certificate signed by the same CA.
    if (c.tls.enabled && c.tls.require_client_cert && c.tls.controller_identity.empty()) {
      tls.Error("controller_identity",
                "the controller certificate's CN or SAN when require_client_cert is true", "none");
    }
    if (!c.tls.controller_identity.empty() && c.tls.ca_file.empty()) {
      tls.Error("ca_file", "a CA file to verify the controller's certificate against", "none");
    }
  }
  {
    YamlReader cap = r.Child("capture");
    cap.ReadBytes("max_bytes", 0, uint64_t{1} << 44, &c.capture.max_bytes);
    cap.ReadUint32("test_delay_ms", 0, 600000, &c.capture.test_delay_ms);
    cap.RejectUnknownKeys();
  }
  {
    YamlReader rec = r.Child("receive");
    rec.ReadEnum("mode", {"in_place", "staged"}, &c.receive.mode);
    rec.ReadBytes("staging_max_bytes", 0, uint64_t{1} << 44, &c.receive.staging_max_bytes);
    rec.ReadUint32("ack_timeout_ms", 1, 600000, &c.receive.ack_timeout_ms);
    rec.ReadUint32("keep_versions", 0, 8, &c.receive.keep_versions);
    rec.ReadBytes("keep_max_bytes", 0, uint64_t{1} << 44, &c.receive.keep_max_bytes);
    rec.ReadUint32("test_swap_delay_ms", 0, 600000, &c.receive.test_swap_delay_ms);
    int64_t delay_version = 0;
    rec.ReadInt("test_swap_delay_version", 0, std::numeric_limits<int64_t>::max(), &delay_version);
    c.receive.test_swap_delay_version = static_cast<uint64_t>(delay_version);
    rec.RejectUnknownKeys();
  }
  ReadStorage(r.Child("storage"), &c.storage);
  {
    YamlReader d = r.Child("delta");
    d.ReadEnum("shadow", {"host", "none"}, &c.delta.shadow);
    d.ReadEnum("gpu_shadow", {"device", "host"}, &c.delta.gpu_shadow);
    d.ReadInt("test_fail_commit_version", 0, std::numeric_limits<int64_t>::max(),
              &c.delta.test_fail_commit_version);
    d.RejectUnknownKeys();
  }
  r.RejectUnknownKeys();
}

void ReadHa(YamlReader r, HaConfig* ha) {
  r.ReadStringList("etcd", &ha->etcd);
  r.ReadString("election", &ha->election);
  r.ReadUint32("lease_ttl_ms", 1000, 600000, &ha->lease_ttl_ms);
  r.ReadString("advertise", &ha->advertise);
  CheckHostPort(r, "advertise", ha->advertise);
  {
    YamlReader t = r.Child("etcd_tls");
    t.ReadString("ca_file", &ha->etcd_ca_file);
    t.ReadString("cert_file", &ha->etcd_cert_file);
    t.ReadString("key_file", &ha->etcd_key_file);
    if (ha->etcd_cert_file.empty() != ha->etcd_key_file.empty()) {
      t.Error("key_file", "cert_file and key_file together", "only one of them");
    }
    t.RejectUnknownKeys();
  }
  const bool tls = !ha->etcd_ca_file.empty();
  for (const auto& url : ha->etcd) {
    const std::string scheme = tls ? "https://" : "http://";
    if (url.rfind(scheme, 0) != 0 || !ValidHostPort(url.substr(scheme.size()))) {
      r.Error("etcd",
              tls ? "etcd client URLs \"https://host:port\" (etcd_tls is set)"
                  : "etcd client URLs \"http://host:port\" (\"https://\" with etcd_tls.ca_file)",
              absl::StrCat("'", url, "'"));
    }
  }
  if (ha->enabled() && ha->election.empty()) {
    r.Error("election", "an election name when etcd is set", "none");
  }
  if (!ha->election.empty() && !std::regex_match(ha->election, std::regex("[A-Za-z0-9._-]+"))) {
    r.Error("election", "letters, digits, '.', '_' or '-'", absl::StrCat("'", ha->election, "'"));
  }
  r.RejectUnknownKeys();
}

// The controller's keys (docs/configuration.md).
void ReadController(YamlReader& r, ControllerConfig& c) {
  r.ReadEnum("log_level", kLogLevels, &c.log_level);
  r.ReadString("listen", &c.listen);
  CheckHostPort(r, "listen", c.listen);
  r.ReadUint32("heartbeat_timeout_ms", 50, 3600000, &c.heartbeat_timeout_ms);
  r.ReadUint32("step_timeout_ms", 10, 3600000, &c.step_timeout_ms);
  r.ReadUint32("plan_wait_ms", 0, 3600000, &c.plan_wait_ms);
  r.ReadUint32("min_replicas", 1, 1 << 20, &c.min_replicas);
  r.ReadBool("step_links", &c.step_links);
  r.ReadString("metrics_listen", &c.metrics_listen);
  CheckHostPort(r, "metrics_listen", c.metrics_listen);

  YamlReader w = r.Child("world");
  w.ReadInt("trainer_ranks", 0, 1 << 20, &c.world.trainer_ranks);
  w.ReadInt("inference_replicas", 0, 1 << 20, &c.world.inference_replicas);
  w.ReadInt("inference_ranks_per_replica", 0, 1 << 20, &c.world.inference_ranks_per_replica);
  w.RejectUnknownKeys();

  ReadNameRules(r, &c.renames, &c.fusions);

  {
    YamlReader rl = r.Child("relays");
    rl.ReadBool("enabled", &c.relays.enabled);
    rl.ReadInt("roots", 0, 1 << 20, &c.relays.roots);
    rl.ReadInt("fanout", 0, 64, &c.relays.fanout);
    rl.RejectUnknownKeys();
  }

  YamlReader cm = r.Child("cost_model");
  cm.ReadDouble("nic_gbps", 0.001, 1e6, &c.cost_model.nic_gbps);
  cm.ReadDouble("op_overhead_us", 0, 1e6, &c.cost_model.op_overhead_us);
  cm.RejectUnknownKeys();

  {
    YamlReader d = r.Child("delta");
    d.ReadBool("enabled", &c.delta.enabled);
    d.ReadUint32("anchor_every", 1, 1000000, &c.delta.anchor_every);
    d.ReadDouble("receive_fraction", 0.001, 1.0, &c.delta.receive_fraction);
    d.ReadBool("verify", &c.delta.verify);
    d.ReadDouble("predict_changed_fraction", 0, 1.0, &c.delta.predict_changed_fraction);
    d.ReadDouble("predict_encode_gbps", 0.001, 1e6, &c.delta.predict_encode_gbps);
    d.ReadDouble("predict_apply_gbps", 0.001, 1e6, &c.delta.predict_apply_gbps);
    d.RejectUnknownKeys();
  }

  ReadTls(r.Child("tls"), &c.tls);
  ReadHa(r.Child("ha"), &c.ha);
  r.RejectUnknownKeys();
}

// Parses `yaml` (named `source` in messages) and reads it into a T with `read`; every error
// `read` finds is reported, all at once.
template <typename T>
absl::StatusOr<T> ParseWith(const std::string& yaml, const std::string& source,
                            void (*read)(YamlReader&, T&)) {
  auto node = ParseYaml(yaml, source);
  if (!node.ok()) return node.status();
  ReadContext ctx{source, {}};
  T c;
  c.source = source;
  YamlReader r(*node, "", &ctx);
  read(r, c);
  return Finish(ctx, std::move(c));
}

}  // namespace

std::vector<std::string> ControllerAddresses(const std::string& controller) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(controller, ',')) {
    std::string a(absl::StripAsciiWhitespace(part));
    if (!a.empty()) out.push_back(std::move(a));
  }
  return out;
}

absl::StatusOr<AgentConfig> ParseAgentConfig(const std::string& yaml, const std::string& source) {
  return ParseWith(yaml, source, ReadAgent);
}

absl::StatusOr<ControllerConfig> ParseControllerConfig(const std::string& yaml,
                                                       const std::string& source) {
  return ParseWith(yaml, source, ReadController);
}

absl::StatusOr<AgentConfig> LoadAgentConfig(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseAgentConfig(*text, path);
}

absl::StatusOr<ControllerConfig> LoadControllerConfig(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseControllerConfig(*text, path);
}

}  // namespace wb::config
