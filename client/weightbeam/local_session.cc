#include "client/weightbeam/local_session.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/gpu/cuda_ipc.h"
#include "common/grpc/status_util.h"
#include "weightbeam/v1/local.grpc.pb.h"

namespace wb::client {

namespace v1 = weightbeam::v1;

struct LocalSession::Impl {
  std::string socket;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Local::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream;
  absl::Mutex mu;  // one request at a time on the stream
  uint64_t next_id = 1;
  // Devices RegisterCuda registered tensors on (SourcesReady synchronizes them).
  absl::Mutex devices_mu;
  std::set<int> cuda_devices ABSL_GUARDED_BY(devices_mu);

  // Event watching: a reader thread fills `events`.
  std::unique_ptr<grpc::ClientContext> watch_ctx;
  std::thread watcher;
  absl::Mutex events_mu;
  std::deque<v1::Event> events ABSL_GUARDED_BY(events_mu);
  bool watch_ended ABSL_GUARDED_BY(events_mu) = false;
  grpc::Status watch_status ABSL_GUARDED_BY(events_mu);  // how the event stream ended
  std::string watcher_name;  // the acknowledging watch's (Watch with ack or swap)
  bool subscribed ABSL_GUARDED_BY(events_mu) = false;
  uint64_t subscribed_version ABSL_GUARDED_BY(events_mu) = 0;

  // Call deadline: a watchdog thread cancels the stream when the agent does not answer a
  // request within `call_timeout` (a frozen agent); the session is then closed.
  std::mutex dog_mu;
  std::condition_variable dog_cv;
  std::thread dog;
  bool dog_stop = false;                                // guarded by dog_mu
  bool call_active = false;                             // guarded by dog_mu
  bool call_timed_out = false;                          // guarded by dog_mu
  std::chrono::steady_clock::time_point call_deadline;  // guarded by dog_mu
  std::atomic<int64_t> call_timeout_ms{120000};

  void Watchdog() {
    std::unique_lock<std::mutex> lock(dog_mu);
    while (!dog_stop) {
      if (!call_active) {
        dog_cv.wait(lock);
        continue;
      }
      const auto deadline = call_deadline;
      dog_cv.wait_until(lock, deadline);
      if (call_active && call_deadline == deadline &&
          std::chrono::steady_clock::now() >= deadline) {
        call_timed_out = true;
        call_active = false;
        ctx.TryCancel();
      }
    }
  }

  void CallStarted() {
    {
      std::lock_guard<std::mutex> lock(dog_mu);
      if (!dog.joinable()) dog = std::thread([this] { Watchdog(); });
      call_active = true;
      call_deadline =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(call_timeout_ms.load());
    }
    dog_cv.notify_one();
  }

  // True when the watchdog cancelled the call.
  bool CallEnded() {
    std::lock_guard<std::mutex> lock(dog_mu);
    call_active = false;
    return call_timed_out;
  }

  absl::Status Broken() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (CallEnded()) {
      stream->Finish().ok();  // cancelled: returns at once
      stream.reset();
      return absl::DeadlineExceededError(
          absl::StrCat("the agent at ", socket, " did not answer within ", call_timeout_ms.load(),
                       " ms; the session is closed (its tensors are withdrawn)"));
    }
    return absl::UnavailableError(absl::StrCat("the agent at ", socket, " closed the session"));
  }

  absl::StatusOr<v1::SessionResponse> Call(v1::SessionRequest req) {
    absl::MutexLock lock(&mu);
    if (!stream) return absl::FailedPreconditionError("the session is closed");
    req.set_request_id(next_id++);
    CallStarted();
    if (!stream->Write(req)) return Broken();
    v1::SessionResponse resp;
    if (!stream->Read(&resp)) return Broken();
    CallEnded();
    if (resp.code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(resp.code()), resp.message());
    }
    return resp;
  }

  // Sends requests made by `make(i)` for i in [0, n) with up to `window` unanswered at once; a
  // reader thread takes the answers (in order: the agent handles one request at a time) while
  // this thread writes, so a full socket on either side never stalls the other. Stops sending
  // after the first answer with an error. (*outcomes)[i]: OK, the agent's error, or CANCELLED.
  absl::Status CallPipelined(size_t n, int window,
                             const std::function<v1::SessionRequest(size_t)>& make,
                             std::vector<absl::Status>* outcomes) {
    outcomes->assign(n, absl::CancelledError("not sent: an earlier batch was refused"));
    if (n == 0) return absl::OkStatus();
    window = std::max(window, 1);
    absl::MutexLock lock(&mu);
    if (!stream) return absl::FailedPreconditionError("the session is closed");
    std::mutex m;
    std::condition_variable cv;
    size_t sent = 0, answered = 0;  // guarded by m
    bool sending_done = false, refused = false, broken = false;
    const uint64_t first_id = next_id;
    std::thread reader([&] {
      v1::SessionResponse resp;
      while (true) {
        {
          std::unique_lock<std::mutex> l(m);
          cv.wait(l, [&] { return answered < sent || sending_done; });
          if (answered == sent) return;  // everything sent was answered
        }
        if (!stream->Read(&resp)) {
          std::lock_guard<std::mutex> l(m);
          broken = true;
          cv.notify_all();
          return;
        }
        CallStarted();  // an answer came: the next one has its own full timeout
        std::lock_guard<std::mutex> l(m);
        const size_t i = answered++;
        absl::Status st =
            resp.request_id() != first_id + i
                ? absl::InternalError(absl::StrCat("answer ", resp.request_id(),
                                                   " out of order (expected ", first_id + i, ")"))
            : resp.code() != 0
                ? absl::Status(static_cast<absl::StatusCode>(resp.code()), resp.message())
                : absl::OkStatus();
        if (!st.ok()) refused = true;
        (*outcomes)[i] = std::move(st);
        cv.notify_all();
      }
    });
    CallStarted();
    for (size_t i = 0; i < n; ++i) {
      {
        std::unique_lock<std::mutex> l(m);
        cv.wait(l,
                [&] { return sent - answered < static_cast<size_t>(window) || refused || broken; });
        if (refused || broken) break;
      }
      v1::SessionRequest req = make(i);
      req.set_request_id(next_id++);
      if (!stream->Write(req)) {
        std::lock_guard<std::mutex> l(m);
        broken = true;
        break;
      }
      std::lock_guard<std::mutex> l(m);
      ++sent;
      cv.notify_all();
    }
    {
      std::lock_guard<std::mutex> l(m);
      sending_done = true;
      cv.notify_all();
    }
    reader.join();
    if (broken) {
      // What was sent and not answered is unknown: say so for those batches.
      for (size_t i = answered; i < sent; ++i) {
        (*outcomes)[i] = absl::UnknownError("sent, but the session ended before its answer");
      }
      return Broken();
    }
    CallEnded();
    return absl::OkStatus();
  }

  void Close() {
    {
      absl::MutexLock lock(&mu);
      if (stream) {
        stream->WritesDone();
        stream->Finish().ok();
        stream.reset();
      }
    }
    if (watch_ctx) watch_ctx->TryCancel();
    if (watcher.joinable()) watcher.join();
    {
      std::lock_guard<std::mutex> lock(dog_mu);
      dog_stop = true;
    }
    dog_cv.notify_one();
    if (dog.joinable()) dog.join();
  }

  ~Impl() { Close(); }
};

LocalSession::LocalSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalSession::LocalSession(LocalSession&&) noexcept = default;
LocalSession& LocalSession::operator=(LocalSession&&) noexcept = default;
LocalSession::~LocalSession() = default;

absl::StatusOr<LocalSession> LocalSession::Connect(const std::string& socket_path,
                                                   const Identity& who) {
  auto impl = std::make_unique<Impl>();
  impl->socket = socket_path;
  impl->channel = grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials());
  if (!impl->channel->WaitForConnected(std::chrono::system_clock::now() +
                                       std::chrono::seconds(5))) {
    return absl::UnavailableError(
        absl::StrCat("no wb-agent answers on ", socket_path, " (is it running?)"));
  }
  impl->stub = v1::Local::NewStub(impl->channel);
  impl->stream = impl->stub->Session(&impl->ctx);
  v1::SessionRequest hello;
  hello.mutable_hello()->set_role(who.role);
  hello.mutable_hello()->set_rank(who.rank);
  hello.mutable_hello()->set_replica(who.replica);
  hello.mutable_hello()->set_pid(getpid());
  auto resp = impl->Call(hello);
  if (!resp.ok()) return resp.status();
  return LocalSession(std::move(impl));
}

namespace {
// Names travel as protobuf strings, which must be UTF-8: the agent cannot even parse a request
// that breaks this, so it would only close the session. Checked here to say what is wrong.
bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int more = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : -1;
    if (more < 0 || (more > 0 && i + more >= s.size())) return false;
    uint32_t cp = more == 0 ? c : c & (0x3f >> more);
    for (int k = 1; k <= more; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[more] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += more + 1;
  }
  return true;
}

absl::Status CheckName(const std::string& name) {
  if (ValidUtf8(name)) return absl::OkStatus();
  std::string hex;
  for (unsigned char c : name.substr(0, 64)) absl::StrAppend(&hex, absl::Hex(c, absl::kZeroPad2));
  return absl::InvalidArgumentError(
      absl::StrCat("tensor name is not valid UTF-8 (bytes ", hex, ")"));
}

void FillSpec(const TensorInfo& t, v1::TensorSpec* spec) {
  spec->set_name(t.name);
  spec->set_dtype(t.dtype);
  for (int64_t d : t.global_shape) spec->add_global_shape(d);
  for (const auto& [start, size] : t.shard) {
    auto* s = spec->add_shard();
    s->set_start(start);
    s->set_size(size);
  }
  if (!t.view_shape.empty()) {
    auto* v = spec->mutable_view();
    for (int64_t d : t.view_shape) v->add_shape(d);
    for (int64_t o : t.view_offset) v->add_offset(o);
    v->set_buffer(t.view_buffer);
  }
}

void FillBatch(const std::vector<BufferSlice>& tensors, const SharedBuffer& buffer,
               v1::RegisterTensors* batch) {
  batch->mutable_tensors()->Reserve(static_cast<int>(tensors.size()));
  for (const auto& t : tensors) {
    auto* reg = batch->add_tensors();
    FillSpec(t.tensor, reg->mutable_spec());
    auto* shm = reg->mutable_memory()->mutable_host_shm();
    shm->set_shm_name(buffer.shm_name());
    shm->set_offset(t.offset);
    shm->set_length(t.length);
  }
}
}  // namespace

absl::Status LocalSession::Register(const TensorInfo& tensor, const SharedBuffer& buffer,
                                    uint64_t offset, uint64_t length) {
  if (auto s = CheckName(tensor.name); !s.ok()) return s;
  v1::SessionRequest req;
  req.mutable_register_()->set_omit_layouts(true);  // only the status is returned
  auto* reg = req.mutable_register_()->add_tensors();
  FillSpec(tensor, reg->mutable_spec());
  auto* shm = reg->mutable_memory()->mutable_host_shm();
  shm->set_shm_name(buffer.shm_name());
  shm->set_offset(offset);
  shm->set_length(length);
  return impl_->Call(req).status();
}

absl::Status LocalSession::RegisterBatch(const std::vector<BufferSlice>& tensors,
                                         const SharedBuffer& buffer) {
  for (const auto& t : tensors) {
    if (auto s = CheckName(t.tensor.name); !s.ok()) return s;
  }
  v1::SessionRequest req;
  auto* batch = req.mutable_register_();
  batch->set_omit_layouts(true);  // only the status is returned
  FillBatch(tensors, buffer, batch);
  return impl_->Call(std::move(req)).status();
}

absl::Status LocalSession::RegisterBatches(const std::vector<std::vector<BufferSlice>>& batches,
                                           const SharedBuffer& buffer, int in_flight,
                                           std::vector<absl::Status>* outcomes) {
  for (const auto& batch : batches) {
    for (const auto& t : batch) {
      if (auto s = CheckName(t.tensor.name); !s.ok()) return s;
    }
  }
  std::vector<absl::Status> mine;
  std::vector<absl::Status>& out = outcomes ? *outcomes : mine;
  auto make = [&](size_t i) {
    v1::SessionRequest req;
    auto* reg = req.mutable_register_();
    reg->set_omit_layouts(true);
    FillBatch(batches[i], buffer, reg);
    return req;
  };
  if (auto s = impl_->CallPipelined(batches.size(), in_flight, make, &out); !s.ok()) return s;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!out[i].ok()) {
      return absl::Status(out[i].code(),
                          absl::StrCat("batch ", i, " of ", out.size(), ": ", out[i].message()));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalSession::RegisterCuda(const TensorInfo& tensor, void* device_ptr, uint64_t length,
                                        int device) {
  if (auto s = CheckName(tensor.name); !s.ok()) return s;
  // The handle names the allocation; the agent opens it and checks the range against it.
  auto ipc = gpu::GetIpcHandle(device_ptr, length);
  if (!ipc.ok()) {
    return absl::Status(ipc.status().code(), absl::StrCat("tensor '", tensor.name,
                                                          "': CUDA IPC: ", ipc.status().message()));
  }
  if (ipc->device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", tensor.name, "': pointer is on cuda:", ipc->device(), ", not cuda:", device));
  }
  v1::SessionRequest req;
  auto* reg = req.mutable_register_()->add_tensors();
  FillSpec(tensor, reg->mutable_spec());
  req.mutable_register_()->set_omit_layouts(true);
  *reg->mutable_memory()->mutable_cuda_ipc() = std::move(*ipc);
  if (auto s = impl_->Call(std::move(req)).status(); !s.ok()) return s;
  absl::MutexLock lock(&impl_->devices_mu);
  impl_->cuda_devices.insert(device);
  return absl::OkStatus();
}

absl::Status LocalSession::SourcesReady() {
  std::set<int> devices;
  {
    absl::MutexLock lock(&impl_->devices_mu);
    devices = impl_->cuda_devices;
  }
  for (int device : devices) {
    if (auto s = gpu::SynchronizeDevice(device); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("sources ready: ", s.message()));
    }
  }
  return absl::OkStatus();
}

void LocalSession::SetCallTimeout(std::chrono::milliseconds timeout) {
  impl_->call_timeout_ms = timeout.count();
}

absl::Status LocalSession::Unregister(const std::string& name) {
  if (auto s = CheckName(name); !s.ok()) return s;
  v1::SessionRequest req;
  req.mutable_unregister()->add_names(name);
  return impl_->Call(req).status();
}

absl::StatusOr<PublishReport> LocalSession::Publish(uint64_t version) {
  v1::SessionRequest req;
  req.mutable_publish()->set_version(version);
  auto resp = impl_->Call(req);
  if (!resp.ok()) return resp.status();
  const v1::PublishResult& p = resp->published();
  PublishReport r;
  r.version = p.version();
  r.anchor = p.anchor();
  r.base_version = p.base_version();
  r.bytes_written = p.bytes_written();
  r.dense_bytes = p.dense_bytes();
  r.changed_elements = p.changed_elements();
  r.files.assign(p.files().begin(), p.files().end());
  r.seconds = p.seconds();
  return r;
}

absl::Status LocalSession::Watch(std::chrono::milliseconds confirm_timeout) {
  return Watch(WatchOptions{}, confirm_timeout);
}

std::string LocalSession::watcher_name() const { return impl_->watcher_name; }

absl::Status LocalSession::Ack(uint64_t version, const std::string& error) {
  if (impl_->watcher_name.empty()) {
    return absl::FailedPreconditionError("ack: watch with ack or swap first");
  }
  v1::SessionRequest req;
  req.mutable_ack()->set_version(version);
  req.mutable_ack()->set_watcher(impl_->watcher_name);
  req.mutable_ack()->set_error(error);
  return impl_->Call(std::move(req)).status();
}

absl::Status LocalSession::Watch(const WatchOptions& options,
                                 std::chrono::milliseconds confirm_timeout) {
  if (impl_->watcher.joinable()) return absl::OkStatus();
  impl_->watch_ctx = std::make_unique<grpc::ClientContext>();
  v1::WatchEventsRequest req;
  req.set_send_subscribed(true);
  if (options.ack || options.swap) {
    // One name per session unless the caller picks one: pid and a counter.
    static std::atomic<uint64_t> sessions{0};
    impl_->watcher_name = options.watcher.empty()
                              ? absl::StrCat("pid ", getpid(), " session ", ++sessions)
                              : options.watcher;
    req.set_ack(options.ack);
    req.set_swap(options.swap);
    req.set_watcher(impl_->watcher_name);
  }
  auto reader = impl_->stub->WatchEvents(impl_->watch_ctx.get(), req);
  Impl* impl = impl_.get();
  impl_->watcher = std::thread([impl, r = std::move(reader)]() mutable {
    v1::Event e;
    while (r->Read(&e)) {
      absl::MutexLock lock(&impl->events_mu);
      if (e.kind() == v1::Event::KIND_SUBSCRIBED) {
        impl->subscribed = true;
        impl->subscribed_version = e.version();
        continue;
      }
      impl->events.push_back(e);
    }
    grpc::Status finished = r->Finish();
    absl::MutexLock lock(&impl->events_mu);
    impl->watch_status = finished;
    impl->watch_ended = true;
  });
  absl::MutexLock lock(&impl->events_mu);
  auto confirmed = [impl]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl->events_mu) {
    return impl->subscribed || impl->watch_ended;
  };
  impl->events_mu.AwaitWithTimeout(absl::Condition(&confirmed), absl::FromChrono(confirm_timeout));
  if (impl->watch_ended && !impl->subscribed) {
    return absl::UnavailableError(
        absl::StrCat("the agent at ", impl->socket,
                     " ended the event stream: ", impl->watch_status.error_message()));
  }
  return absl::OkStatus();
}

uint64_t LocalSession::watch_start_version() const {
  absl::MutexLock lock(&impl_->events_mu);
  return impl_->subscribed_version;
}

absl::StatusOr<v1::Event> LocalSession::NextEvent(std::chrono::milliseconds timeout) {
  Impl* impl = impl_.get();
  absl::MutexLock lock(&impl->events_mu);
  auto ready = [impl]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl->events_mu) {
    return !impl->events.empty() || impl->watch_ended;
  };
  impl->events_mu.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(timeout));
  if (!impl->events.empty()) {
    v1::Event e = impl->events.front();
    impl->events.pop_front();
    return e;
  }
  if (impl->watch_ended) return absl::UnavailableError("the agent ended the event stream");
  return absl::DeadlineExceededError(absl::StrCat("no event within ", timeout.count(), " ms"));
}

void LocalSession::Close() {
  if (impl_) impl_->Close();
}

}  // namespace wb::client
