// Memory identity (issue 14, class 1) with real processes: the agent runs as root and can open
// anyone's /dev/shm object, so a local process in the socket's group must not get it to map an
// object that process could not open itself, as a source (copied out by the next step) or as a
// destination (overwritten). The caller's identity comes from the socket (SO_PEERCRED).
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "weightbeam/v1/local.grpc.pb.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;
using wb::testing::ClusterOptions;

namespace {

constexpr uid_t kNobody = 65534;
constexpr uint64_t kBytes = 4096;

// Exit codes of the unprivileged child.
enum : int { kRefused = 10, kAccepted = 11, kNoSession = 12, kOwnRefused = 13 };

// One registration of `length` bytes of the object `shm` over a raw Local session as `role`:
// the message a hostile process can send, whatever the client library would check first.
absl::Status RawRegister(const std::string& socket, v1::Role role, const std::string& tensor,
                         const std::string& shm) {
  auto stub =
      v1::Local::NewStub(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub->Session(&ctx);
  v1::SessionRequest hello;
  hello.set_request_id(1);
  hello.mutable_hello()->set_role(role);
  hello.mutable_hello()->set_pid(1);  // a lie: the agent takes the pid from the socket
  v1::SessionResponse resp;
  if (!stream->Write(hello) || !stream->Read(&resp)) return absl::UnavailableError("no session");
  v1::SessionRequest reg;
  reg.set_request_id(2);
  auto* t = reg.mutable_register_()->add_tensors();
  t->mutable_spec()->set_name(tensor);
  t->mutable_spec()->set_dtype(v1::DTYPE_U8);
  t->mutable_spec()->add_global_shape(kBytes);
  t->mutable_memory()->mutable_host_shm()->set_shm_name(shm);
  t->mutable_memory()->mutable_host_shm()->set_length(kBytes);
  if (!stream->Write(reg) || !stream->Read(&resp)) return absl::UnavailableError("no answer");
  stream->WritesDone();
  return absl::Status(static_cast<absl::StatusCode>(resp.code()), resp.message());
}

// Runs as uid/gid nobody in a fresh process (no gRPC state inherited): registers `victim` (a
// root-owned 0600 object) as `role`; then its own object, which must be accepted.
[[noreturn]] void Child(const std::string& socket, const std::string& victim, v1::Role role) {
  if (setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(2);
  absl::Status s = RawRegister(socket, role, "stolen.weight", victim);
  std::fprintf(stderr, "child (uid %d), root's object: %s\n", getuid(), s.ToString().c_str());
  if (s.ok()) _exit(kAccepted);
  if (s.code() == absl::StatusCode::kUnavailable) _exit(kNoSession);
  if (std::string(s.message()).find("may not be read and written by the caller") ==
      std::string::npos) {
    _exit(3);
  }
  auto own = SharedBuffer::Create(kBytes, "own");
  if (!own.ok()) _exit(4);
  absl::Status ok = RawRegister(socket, role, "own.weight", own->shm_name());
  std::fprintf(stderr, "child, own object: %s\n", ok.ToString().c_str());
  // _exit skips destructors: unlink the object here, or a later child with a reused pid finds
  // the name taken.
  shm_unlink(own->shm_name().c_str());
  _exit(ok.ok() ? kRefused : kOwnRefused);
}

int RunChild(const std::string& socket, const std::string& victim, v1::Role role) {
  pid_t pid = fork();
  if (pid == 0) Child(socket, victim, role);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("a local user cannot register another user's shared memory", "[security]") {
  // Forks before anything in this process touches gRPC.
  ClusterOptions options;
  options.extra_agent_yaml = "socket_mode: 0666\n";
  Cluster cluster(wb::testing::Runfile(""), options);
  REQUIRE(chmod(cluster.dir().c_str(), 0755) == 0);  // nobody reaches the socket

  const std::string victim = "/wb-sec-victim-" + std::to_string(getpid());
  int fd = shm_open(victim.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(fchmod(fd, 0600) == 0);
  REQUIRE(ftruncate(fd, kBytes) == 0);
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  std::memset(p, 0x5a, kBytes);  // root's secret weights

  CHECK(RunChild(cluster.socket("trainer-node"), victim, v1::ROLE_TRAINER) == kRefused);
  CHECK(RunChild(cluster.socket("inference-node"), victim, v1::ROLE_INFERENCE) == kRefused);
  CHECK(cluster.agent("trainer-node")->running());
  CHECK(cluster.agent("inference-node")->running());
  munmap(p, kBytes);
  close(fd);
  shm_unlink(victim.c_str());
}
