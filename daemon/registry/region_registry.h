// Every tensor that local processes registered with this agent: its memory, its registration
// on each transport, and its owner session. Answers Describe and resolves regions for the
// executor. Thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/transport/transport.h"
#include "weightbeam/v1/local.pb.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::registry {

// Keeps registered memory alive (an mmap of a shm object, an opened CUDA IPC handle).
class MemoryHold {
 public:
  virtual ~MemoryHold() = default;
  // Whether [addr, addr + length) is still backed: a shared-memory object's owner may have
  // shrunk it since registration (one fstat). `what` names the tensor and owner for the error.
  virtual absl::Status CheckBacked(const void* addr, uint64_t length,
                                   const std::string& what) const {
    return absl::OkStatus();
  }
};

// Opens a registration's memory handle; the agent plugs in shm and CUDA implementations.
struct OpenedMemory {
  transport::MemoryRef ref;
  std::string location;  // "host" or "cuda:N"
  std::shared_ptr<MemoryHold> hold;
  // The whole buffer `ref` lies in (a shared-memory object's one mapping, a CUDA allocation),
  // which transports with windows register once for all its tensors; `hold` keeps it alive.
  // addr == nullptr: `ref` is its own buffer.
  transport::MemoryRef buffer;
  // Host memory: the shared-memory object `buffer` maps whole (staged swap watchers are told
  // which staging object mirrors it); empty otherwise.
  std::string shm_name;
};
// Who is registering, as the kernel says (SO_PEERCRED on the Local socket), never as the
// request says. `known` is false where no kernel credentials exist; openers then refuse.
struct Caller {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  bool known = false;
  // The registration request this tensor came in (0: none): openers may check a memory object
  // once per request (local::ShmCaller::batch).
  uint64_t batch = 0;
};
using MemoryOpener =
    std::function<absl::StatusOr<OpenedMemory>(const weightbeam::v1::MemoryHandle&, const Caller&)>;

// receive.mode staged (daemon/staging): gives a destination the staging mirror that remote
// writes land in instead of its live memory. The registry registers the mirror with the
// transports, so every transport (and the delta receiver, and relays) writes and reads it.
class DestinationStager {
 public:
  virtual ~DestinationStager() = default;
  // The mirror of `live` (the same length, its bytes copied from live), as memory to register;
  // its hold keeps live and mirror alive. nullopt: the staging budget is spent; the tensor is
  // registered in place and counted, and the next plan load is refused (never a silent fallback).
  virtual absl::StatusOr<std::optional<OpenedMemory>> Mirror(const OpenedMemory& live,
                                                             const Caller& caller) = 0;
};

// The current keys of a buffer's registration with the transports that rekey it (rdma: a
// withdrawal inside the buffer registers it afresh), shared by the buffer's tensors, so that
// every tensor's layout shows the buffer's key of the moment (with the tensor's base).
struct LiveKeys {
  mutable absl::Mutex mu;
  // transport -> one key per device (base 0; transport_region and region_length set)
  std::map<std::string, std::vector<weightbeam::v1::RemoteKey>> keys ABSL_GUARDED_BY(mu);
};

struct RegisteredTensor {
  uint64_t region_id = 0;  // agent-wide id; reported to the controller
  uint64_t session = 0;
  weightbeam::v1::TensorSpec spec;
  weightbeam::v1::Owner owner;
  // The registering process's user (SO_PEERCRED), when known: a staged swap waits only for the
  // watchers of the users whose tensors it writes, and a user's swap watcher swaps only that
  // user's tensors.
  std::optional<uid_t> uid;
  // Where writes land and sends read: the live memory, or its staging mirror when staged.
  transport::MemoryRef memory;
  // The memory its owner reads (the live tensor); the same as `memory` unless staged.
  transport::MemoryRef live;
  bool staged = false;
  std::string location;
  std::shared_ptr<MemoryHold> hold;
  // transport name -> the region id that transport assigned (its buffer's, where the transport
  // registers buffers)
  std::map<std::string, uint64_t> transport_regions;
  // transport name -> where the tensor's first byte lies in that region (absent: 0)
  std::map<std::string, uint64_t> transport_bases;
  uint64_t BaseIn(const std::string& transport) const {
    auto it = transport_bases.find(transport);
    return it == transport_bases.end() ? 0 : it->second;
  }
  // The buffer registration this tensor holds a window of (empty: none).
  std::string buffer_registration;
  // transport name -> why it declined this region (transport::DeclineRegion); routes over it
  // cannot reach the tensor.
  std::map<std::string, std::string> declined;
  // Merged keys of all transports, but those of rekeying transports (live_keys).
  weightbeam::v1::RegionDescriptor descriptor;
  std::shared_ptr<const LiveKeys> live_keys;  // its buffer's, where a transport rekeys it
  // For a part of a buffer (a spec with a view): the memory range it shares with the
  // buffer's other parts; empty otherwise.
  std::string buffer_key;
  // Destinations only: the memory object (shm name, CUDA allocation) and the byte range of it
  // the handle covers; no two destinations of different tensors may share a byte.
  std::string object_key;
  uint64_t object_offset = 0, object_length = 0;
};

// One transport's registrations for local processes' tensors (Health, metrics).
struct TransportRegistrationStats {
  std::string transport;
  uint64_t regions = 0;     // live now
  uint64_t registered = 0;  // made since start
  double seconds = 0;       // spent in the transport's Register / RegisterBuffer
};

class RegionRegistry {
 public:
  RegionRegistry(std::vector<transport::Transport*> transports, MemoryOpener opener);

  // Validates, opens the memory and registers it with every transport (destinations for
  // inference owners, sources for trainers); a transport that declines the region is left out
  // (at least one must take it). Errors name the tensor and leave nothing behind.
  absl::StatusOr<weightbeam::v1::TensorLayout> Register(
      uint64_t session, const weightbeam::v1::Owner& owner,
      const weightbeam::v1::TensorRegistration& registration, const Caller& caller = {});
  // The same for a caller that registers many at once: returns the tensor's region id instead
  // of building its layout, and calls the change callback only when `notify` (a batch calls
  // NotifyChanged once at its end).
  absl::StatusOr<uint64_t> RegisterQuiet(uint64_t session, const weightbeam::v1::Owner& owner,
                                         const weightbeam::v1::TensorRegistration& registration,
                                         const Caller& caller, bool notify);
  // Calls the change callback (after RegisterQuiet without notify).
  void NotifyChanged();
  absl::Status Unregister(uint64_t session, const std::string& name);
  // Withdraws exactly the regions `region_ids` of `session` (a refused batch's undo: by the
  // registrations it made, never by name), releasing each buffer once.
  void UnregisterRegions(uint64_t session, const std::vector<uint64_t>& region_ids);
  // Withdraws everything a session registered (the process ended). When this returns, no
  // remote write can land in that memory any more.
  int WithdrawSession(uint64_t session);

  std::shared_ptr<const RegisteredTensor> Find(uint64_t region_id) const;
  // Every destination (inference) tensor registered now: the staged swap copies them.
  std::vector<std::shared_ptr<const RegisteredTensor>> Destinations() const;
  // receive.mode staged: destinations register their staging mirror (set before serving).
  void SetStager(DestinationStager* stager) { stager_ = stager; }
  weightbeam::v1::AgentLayout Layout(const std::string& agent_name) const;
  uint64_t generation() const;
  size_t size() const;
  std::vector<TransportRegistrationStats> RegistrationStats() const;
  // Called (outside the lock) after every change of the layout.
  void SetChangeCallback(std::function<void()> cb);

 private:
  absl::Status CheckConflicts(uint64_t session, const weightbeam::v1::Owner& owner,
                              const weightbeam::v1::TensorSpec& spec, const std::string& buffer_key,
                              const weightbeam::v1::MemoryHandle* memory) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(const RegisteredTensor& t);
  // Releases several tensors, closing the windows of each buffer in one call per transport (a
  // rekeying transport re-registers a buffer once, not once per tensor). Returns whether a
  // buffer's keys changed (the layout must then be fetched again).
  bool ReleaseAll(const std::vector<const RegisteredTensor*>& tensors);
  // The tensor's descriptor as peers see it: its own keys and its buffer's current ones.
  static void FillRegion(const RegisteredTensor& t, weightbeam::v1::RegionDescriptor* out);
  // Registers the tensor's buffer with every transport that has windows (once per buffer) and
  // opens the tensor's window in it; fills t's regions, bases, keys and declines.
  absl::Status AttachToBuffer(RegisteredTensor* t, const OpenedMemory& opened,
                              transport::Access access);
  // Closes the windows of `tensors`, all of one buffer registration; deregisters the buffer
  // with its last tensor. Returns whether a rekeying transport's keys changed.
  bool DetachFromBuffer(const std::string& registration,
                        const std::vector<const RegisteredTensor*>& tensors);
  // Register / RegisterBuffer on transport `i`, timed and counted.
  absl::StatusOr<weightbeam::v1::RegionDescriptor> TimedRegister(size_t i,
                                                                 const transport::MemoryRef& mem,
                                                                 transport::Access access,
                                                                 bool buffer);
  void CountDeregistered(size_t i);
  // After a window change on rekeying transport `i`: reads the buffer's keys again; when they
  // changed, stores them and counts a registration taking `seconds`. Returns whether they did.
  bool RefreshKeys(size_t i, uint64_t region, uint64_t length, LiveKeys* live, double seconds);
  void IndexLocked(const RegisteredTensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnindexLocked(const RegisteredTensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed();

  std::vector<transport::Transport*> transports_;
  std::vector<bool> windowed_;  // per transport: caps().windows
  std::vector<bool> rekeys_;    // per transport: caps().rekeys
  MemoryOpener opener_;
  DestinationStager* stager_ = nullptr;

  // A buffer registered once with the windowed transports, shared by the tensors inside it.
  struct BufferRegistration {
    std::shared_ptr<MemoryHold> hold;  // keeps the memory mapped while registered
    transport::MemoryRef memory;
    std::map<std::string, uint64_t> regions;                             // transport -> region id
    std::map<std::string, std::vector<weightbeam::v1::RemoteKey>> keys;  // transport -> per device
    std::shared_ptr<LiveKeys> live = std::make_shared<LiveKeys>();
    std::map<std::string, std::string> declined;
    uint64_t tensors = 0;
  };
  // Taken around a buffer's registration and each window's opening and closing: a buffer is
  // registered once however many tensors arrive at once, and deregistered with its last one.
  absl::Mutex buffers_mu_;
  std::unordered_map<std::string, BufferRegistration> buffers_ ABSL_GUARDED_BY(buffers_mu_);
  struct Counts {
    uint64_t regions = 0, registered = 0;
    double seconds = 0;
  };
  mutable absl::Mutex stats_mu_;
  std::vector<Counts> counts_ ABSL_GUARDED_BY(stats_mu_);
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<RegisteredTensor>> by_region_ ABSL_GUARDED_BY(mu_);
  // Indexes over by_region_, so a registration checks only same-name tensors and a session's
  // withdrawal touches only its own: name -> region ids, session -> region ids.
  std::unordered_map<std::string, std::vector<uint64_t>> by_name_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::vector<uint64_t>> by_session_ ABSL_GUARDED_BY(mu_);
  // buffer key -> region ids of the parts registered in that memory range.
  std::unordered_map<std::string, std::vector<uint64_t>> by_buffer_ ABSL_GUARDED_BY(mu_);
  // memory object -> its destinations by start offset (region ids): a registration looks at the
  // ranges that start inside its own and the nearest before it, not at every tensor (10^5 in
  // one buffer).
  std::unordered_map<std::string, std::multimap<uint64_t, uint64_t>> by_object_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_region_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> on_change_;
};

}  // namespace wb::registry
