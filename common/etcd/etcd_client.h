// A small client of etcd v3's HTTP/JSON gateway (the `/v3/...` endpoints etcd 3.4 serves next to
// gRPC on its client URLs): leases, put/range/delete and the one transaction leader election
// needs. HTTP/JSON rather than gRPC because etcd's protos are not packaged by Debian, and the
// gateway is the documented stable surface; cpp-httplib and nlohmann-json already ship with us.
// "https://" endpoints speak TLS, verifying the members against `ca_file` and presenting
// `cert_file` / `key_file` when given.
//
// A client holds several endpoints (the members of one cluster): a call goes to the endpoint that
// last worked and moves on to the next when it cannot connect, times out, or the member answers
// "unavailable" (no raft leader). Every attempt has a timeout, so every call is bounded.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace wb::etcd {

struct EtcdClientOptions {
  // Base URLs, e.g. "http://127.0.0.1:2379". At least one.
  std::vector<std::string> endpoints;
  // Bound on one HTTP attempt against one endpoint (connect, write and read each).
  absl::Duration attempt_timeout = absl::Seconds(2);
  // TLS to etcd ("https://" endpoints): the CA that signed the members' certificates, and this
  // client's certificate and key for members that require one (--client-cert-auth).
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// One key as etcd stores it. Revisions are etcd's store revisions (monotonic over the cluster).
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct Lease {
  int64_t id = 0;
  absl::Duration ttl;  // as granted: etcd raises TTLs below its minimum (2 s by default)
};

// The outcome of CreateIfAbsent: whether this call created the key, and the key as it stands.
struct CreateResult {
  bool created = false;
  std::optional<KeyValue> current;
};

class EtcdClient {
 public:
  explicit EtcdClient(EtcdClientOptions options);

  absl::StatusOr<Lease> LeaseGrant(absl::Duration ttl);
  // Renews the lease once; returns its TTL as renewed. NotFound when the lease has expired or was
  // revoked. `within` caps the whole call (all endpoints tried): a leader must regain control
  // before its lease can run out, whatever the network does.
  absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t lease_id,
                                                absl::Duration within = absl::InfiniteDuration());
  // Revokes the lease, deleting every key attached to it. NotFound when it is already gone.
  absl::Status LeaseRevoke(int64_t lease_id);

  // Puts `value` at `key` (attached to `lease_id` unless 0); returns the new store revision.
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              int64_t lease_id = 0);
  // The key, or nullopt when it does not exist.
  absl::StatusOr<std::optional<KeyValue>> Get(const std::string& key);
  // Deletes the key; returns how many keys were deleted (0 or 1).
  absl::StatusOr<int64_t> Delete(const std::string& key);
  // One transaction: if the key does not exist (create_revision == 0) put it, then read it back
  // either way. Atomic, so of racing callers exactly one sees `created`.
  absl::StatusOr<CreateResult> CreateIfAbsent(const std::string& key, const std::string& value,
                                              int64_t lease_id = 0);

  // One transaction: puts `value` at `key` only while `guard_key` exists with create_revision
  // `guard_revision` (a leader writing while it still holds its election key). False: the guard
  // failed, nothing written.
  absl::StatusOr<bool> PutIfGuard(const std::string& key, const std::string& value,
                                  const std::string& guard_key, int64_t guard_revision,
                                  int64_t lease_id = 0);
  // Every key starting with `prefix`, in key order.
  absl::StatusOr<std::vector<KeyValue>> GetPrefix(const std::string& prefix);

  const std::vector<std::string>& endpoints() const { return options_.endpoints; }

 private:
  // POSTs a JSON body to `path` (e.g. "/v3/kv/put"), failing over between endpoints; returns the
  // parsed JSON response text on HTTP 200, or the gateway's error as an absl::Status.
  absl::StatusOr<std::string> Post(const std::string& path, const std::string& body,
                                   absl::Duration within);

  EtcdClientOptions options_;
  std::atomic<size_t> preferred_{0};  // index of the endpoint that last answered
};

}  // namespace wb::etcd
