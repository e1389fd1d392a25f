#include "common/etcd/etcd_client.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace wb::etcd {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The gateway writes int64 fields as JSON strings (proto3 JSON mapping) and omits zero values.
int64_t Int64Field(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return 0;
  int64_t v = 0;
  if (it->is_string()) return absl::SimpleAtoi(it->get<std::string>(), &v) ? v : 0;
  return it->is_number_integer() ? it->get<int64_t>() : 0;
}

std::string Unbase64(const Json& j, const char* name) {
  auto it = j.find(name);
  std::string out;
  if (it != j.end() && it->is_string()) absl::Base64Unescape(it->get<std::string>(), &out);
  return out;
}

KeyValue ParseKeyValue(const Json& j) {
  KeyValue kv;
  kv.key = Unbase64(j, "key");
  kv.value = Unbase64(j, "value");
  kv.create_revision = Int64Field(j, "create_revision");
  kv.mod_revision = Int64Field(j, "mod_revision");
  kv.version = Int64Field(j, "version");
  kv.lease = Int64Field(j, "lease");
  return kv;
}

// The first key of a RangeResponse, if any.
std::optional<KeyValue> FirstKey(const Json& range) {
  auto it = range.find("kvs");
  if (it == range.end() || !it->is_array() || it->empty()) return std::nullopt;
  return ParseKeyValue(it->front());
}

int64_t HeaderRevision(const Json& j) {
  auto it = j.find("header");
  return it == j.end() ? 0 : Int64Field(*it, "revision");
}

// The gateway's error body ({"error", "message", "code"} with a gRPC code, which absl shares).
absl::Status GatewayError(const std::string& where, int http_status, const std::string& body) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) j = j["error"];
  if (!j.is_object() || !j.contains("code")) {
    return absl::UnavailableError(absl::StrCat(where, ": HTTP ", http_status, ": ", body));
  }
  auto code = static_cast<absl::StatusCode>(j.value("code", 2));
  return absl::Status(code, absl::StrCat(where, ": ", j.value("message", body)));
}

absl::StatusOr<Json> ParseBody(const std::string& where, const std::string& body) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InternalError(absl::StrCat(where, ": not a JSON object: ", body));
  }
  return j;
}

// Sets every httplib timeout of one attempt; httplib takes seconds and microseconds.
void SetTimeouts(httplib::Client& client, absl::Duration timeout) {
  int64_t us = std::max<int64_t>(absl::ToInt64Microseconds(timeout), 1000);
  time_t sec = us / 1000000;
  time_t usec = us % 1000000;
  client.set_connection_timeout(sec, usec);
  client.set_read_timeout(sec, usec);
  client.set_write_timeout(sec, usec);
}

}  // namespace

EtcdClient::EtcdClient(EtcdClientOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::string> EtcdClient::Post(const std::string& path, const std::string& body,
                                             absl::Duration within) {
  const size_t n = options_.endpoints.size();
  if (n == 0) return absl::FailedPreconditionError("etcd: no endpoints configured");
  const auto deadline = within == absl::InfiniteDuration()
                            ? Clock::time_point::max()
                            : Clock::now() + absl::ToChronoNanoseconds(within);
  absl::Status last;
  const size_t first = preferred_.load();
  for (size_t i = 0; i < n; ++i) {
    const size_t index = (first + i) % n;
    const std::string& endpoint = options_.endpoints[index];
    const std::string where = absl::StrCat("etcd ", endpoint, path);
    absl::Duration timeout = options_.attempt_timeout;
    if (deadline != Clock::time_point::max()) {
      auto left = absl::FromChrono(deadline - Clock::now());
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            absl::StrCat(where, ": out of time (", last.message(), ")"));
      }
      timeout = std::min(timeout, left);
    }
    httplib::Client client = options_.cert_file.empty()
                                 ? httplib::Client(endpoint)
                                 : httplib::Client(endpoint, options_.cert_file, options_.key_file);
    if (!options_.ca_file.empty()) client.set_ca_cert_path(options_.ca_file);
    client.enable_server_certificate_verification(true);
    SetTimeouts(client, timeout);
    auto result = client.Post(path.c_str(), body, "application/json");
    if (!result) {
      // Connection refused, reset or timed out: the member may be down; try the next one.
      last = absl::UnavailableError(absl::StrCat(where, ": ", httplib::to_string(result.error())));
      continue;
    }
    if (result->status == 200) {
      preferred_.store(index);
      return result->body;
    }
    last = GatewayError(where, result->status, result->body);
    // A member without a raft leader answers Unavailable; another member may have one.
    if (last.code() != absl::StatusCode::kUnavailable) return last;
  }
  return last;
}

absl::StatusOr<Lease> EtcdClient::LeaseGrant(absl::Duration ttl) {
  const int64_t seconds =
      std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
  Json req = {{"TTL", std::to_string(seconds)}};
  auto body = Post("/v3/lease/grant", req.dump(), absl::InfiniteDuration());
  if (!body.ok()) return body.status();
  auto j = ParseBody("etcd /v3/lease/grant", *body);
  if (!j.ok()) return j.status();
  // LeaseGrantResponse carries its own "error" string (e.g. too many leases).
  const Json error = j->value("error", Json());
  if (error.is_string() && !error.get<std::string>().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd /v3/lease/grant: ", error.get<std::string>()));
  }
  return Lease{Int64Field(*j, "ID"), absl::Seconds(Int64Field(*j, "TTL"))};
}

absl::StatusOr<absl::Duration> EtcdClient::LeaseKeepAlive(int64_t lease_id, absl::Duration within) {
  // A bidirectional stream in gRPC; through the gateway one request body yields one
  // {"result": LeaseKeepAliveResponse} line, then the stream ends.
  Json req = {{"ID", std::to_string(lease_id)}};
  auto body = Post("/v3/lease/keepalive", req.dump(), within);
  if (!body.ok()) return body.status();
  const std::string where = "etcd /v3/lease/keepalive";
  auto j = ParseBody(where, *body);
  if (!j.ok()) return j.status();
  if (j->contains("error")) return GatewayError(where, 200, *body);
  const Json& result = j->contains("result") ? (*j)["result"] : *j;
  const int64_t ttl = Int64Field(result, "TTL");
  // An expired or revoked lease comes back with TTL 0 (omitted), not as an error.
  if (ttl <= 0) return absl::NotFoundError(absl::StrCat(where, ": lease ", lease_id, " is gone"));
  return absl::Seconds(ttl);
}

absl::Status EtcdClient::LeaseRevoke(int64_t lease_id) {
  // etcd 3.4 serves both /v3/lease/revoke and the older /v3/kv/lease/revoke; 3.5 only the first.
  Json req = {{"ID", std::to_string(lease_id)}};
  return Post("/v3/lease/revoke", req.dump(), absl::InfiniteDuration()).status();
}

absl::StatusOr<int64_t> EtcdClient::Put(const std::string& key, const std::string& value,
                                        int64_t lease_id) {
  Json req = {{"key", absl::Base64Escape(key)}, {"value", absl::Base64Escape(value)}};
  if (lease_id != 0) req["lease"] = std::to_string(lease_id);
  auto body = Post("/v3/kv/put", req.dump(), absl::InfiniteDuration());
  if (!body.ok()) return body.status();
  auto j = ParseBody("etcd /v3/kv/put", *body);
  if (!j.ok()) return j.status();
  return HeaderRevision(*j);
}

absl::StatusOr<std::optional<KeyValue>> EtcdClient::Get(const std::string& key) {
  Json req = {{"key", absl::Base64Escape(key)}};
  auto body = Post("/v3/kv/range", req.dump(), absl::InfiniteDuration());
  if (!body.ok()) return body.status();
  auto j = ParseBody("etcd /v3/kv/range", *body);
  if (!j.ok()) return j.status();
  return FirstKey(*j);
}

absl::StatusOr<int64_t> EtcdClient::Delete(const std::string& key) {
  Json req = {{"key", absl::Base64Escape(key)}};
  auto body = Post("/v3/kv/deleterange", req.dump(), absl::InfiniteDuration());
  if (!body.ok()) return body.status();
  auto j = ParseBody("etcd /v3/kv/deleterange", *body);
  if (!j.ok()) return j.status();
  return Int64Field(*j, "deleted");
}

absl::StatusOr<CreateResult> EtcdClient::CreateIfAbsent(const std::string& key,
                                                        const std::string& value,
                                                        int64_t lease_id) {
  const std::string k = absl::Base64Escape(key);
  Json put = {{"key", k}, {"value", absl::Base64Escape(value)}};
  if (lease_id != 0) put["lease"] = std::to_string(lease_id);
  Json range = {{"request_range", {{"key", k}}}};
  // result EQUAL is the enum's zero value; create_revision 0 means "the key does not exist".
  Json req = {
      {"compare",
       Json::array(
           {{{"target", "CREATE"}, {"result", "EQUAL"}, {"key", k}, {"create_revision", "0"}}})},
      {"success", Json::array({{{"request_put", put}}, range})},
      {"failure", Json::array({range})},
  };
  auto body = Post("/v3/kv/txn", req.dump(), absl::InfiniteDuration());
  if (!body.ok()) return body.status();
  auto j = ParseBody("etcd /v3/kv/txn", *body);
  if (!j.ok()) return j.status();
  CreateResult out;
  out.created = j->value("succeeded", false);
  for (const Json& r : j->value("responses", Json::array())) {
    if (r.contains("response_range")) out.current = FirstKey(r["response_range"]);
  }
  return out;
}

absl::StatusOr<bool> EtcdClient::PutIfGuard(const std::string& key, const std::string& value,
                                            const std::string& guard_key, int64_t guard_revision,
                                            int64_t lease_id) {
  Json put = {{"key", absl::Base64Escape(key)}, {"value", absl::Base64Escape(value)}};
  if (lease_id != 0) put["lease"] = std::to_string(lease_id);
  Json req = {
      {"compare", Json::array({{{"target", "CREATE"},
                                {"result", "EQUAL"},
                                {"key", absl::Base64Escape(guard_key)},
                                {"create_revision", std::to_string(guard_revision)}}})},
      {"success", Json::array({{{"request_put", put}}})},
  };
  auto body = Post("/v3/kv/txn", req.dump(), absl::InfiniteDuration());
  if (!body.ok()) return body.status();
  auto j = ParseBody("etcd /v3/kv/txn", *body);
  if (!j.ok()) return j.status();
  return j->value("succeeded", false);
}

absl::StatusOr<std::vector<KeyValue>> EtcdClient::GetPrefix(const std::string& prefix) {
  // range_end: the prefix with its last byte incremented (etcd's prefix convention).
  std::string end = prefix;
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (!end.empty()) end.back() = static_cast<char>(end.back() + 1);
  Json req = {{"key", absl::Base64Escape(prefix)},
              {"range_end", absl::Base64Escape(end.empty() ? std::string(1, '\0') : end)}};
  auto body = Post("/v3/kv/range", req.dump(), absl::InfiniteDuration());
  if (!body.ok()) return body.status();
  auto j = ParseBody("etcd /v3/kv/range", *body);
  if (!j.ok()) return j.status();
  std::vector<KeyValue> out;
  auto it = j->find("kvs");
  if (it != j->end() && it->is_array()) {
    for (const Json& kv : *it) out.push_back(ParseKeyValue(kv));
  }
  return out;
}

}  // namespace wb::etcd
