// The agent's step-link listener (StepLinkServer) under hostile input, in this process: nothing
// runs for a connection that does not present a granted link id and prove its key; a grant is
// good for one connection, and used up only by one that proves its key (a replayed clear-text id
// does not burn it); a forged, replayed or oversized frame on an open link closes it
// before it runs; silent connections are closed at the handshake deadline and capped; and
// through all of it a proper link still runs its commands.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/steplink/link_cipher.h"
#include "daemon/service/step_link_server.h"

namespace wb::service {
namespace {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;
using steplink::Direction;
using steplink::LinkCipher;

// A server whose commands answer with their seq and count how many ran.
struct Served {
  explicit Served(StepLinkOptions options = {}) {
    options.host = "127.0.0.1";
    auto s = StepLinkServer::Start(options, [this](v1::StepCommand c, auto reply) {
      ++ran;
      v1::StepReply r;
      r.set_seq(c.seq());
      r.set_error("ran " + std::to_string(c.begin().version()));
      reply(std::move(r));
    });
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  std::atomic<int> ran{0};
  std::unique_ptr<StepLinkServer> server;
};

// A blocking client connection with a 5 s receive timeout.
int Connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void Write(int fd, const std::string& bytes) {
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(bytes.size()));
}

// True when the server closed the connection (EOF or reset) within the receive timeout.
bool ClosedByServer(int fd) {
  char b[256];
  while (true) {
    ssize_t n = ::recv(fd, b, sizeof(b), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;  // EAGAIN: the timeout passed, still open
  }
}

// Reads one frame body (blocking); empty optional-like: false when the connection ended.
bool ReadFrame(int fd, std::string* body) {
  steplink::FrameReader reader;
  char b[4096];
  while (true) {
    std::string_view v;
    auto has = reader.Next(&v);
    REQUIRE(has.ok());
    if (*has) {
      *body = std::string(v);
      return true;
    }
    ssize_t n = ::recv(fd, b, sizeof(b), 0);
    if (n <= 0) return false;
    reader.Append(b, static_cast<size_t>(n));
  }
}

std::string Hello(const StepLinkServer::Grant& g, LinkCipher* cipher) {
  std::string out = g.link_id;
  REQUIRE(cipher->Seal("", &out).ok());
  return out;
}

std::string Command(LinkCipher* cipher, uint64_t seq, uint64_t version) {
  v1::StepCommand c;
  c.set_seq(seq);
  c.mutable_begin()->set_version(version);
  std::string out;
  REQUIRE(cipher->Seal(c.SerializeAsString(), &out).ok());
  return out;
}

// Opens a proper link: hello, then the acknowledgement read and checked.
int OpenLink(Served& s, LinkCipher* cipher) {
  auto g = s.server->Issue();
  REQUIRE(g.ok());
  *cipher = *LinkCipher::Create(g->key, Direction::kToAgent);
  int fd = Connect(s.server->port());
  Write(fd, Hello(*g, cipher));
  std::string body, plain;
  REQUIRE(ReadFrame(fd, &body));
  REQUIRE(cipher->Open(body, &plain).ok());
  REQUIRE(plain.empty());
  return fd;
}

// Sends command `version` on an open link and returns the reply's text.
std::string RunOn(int fd, LinkCipher* cipher, uint64_t seq, uint64_t version) {
  Write(fd, Command(cipher, seq, version));
  std::string body, plain;
  REQUIRE(ReadFrame(fd, &body));
  REQUIRE(cipher->Open(body, &plain).ok());
  v1::StepReply r;
  REQUIRE(r.ParseFromString(plain));
  CHECK(r.seq() == seq);
  return r.error();
}

TEST_CASE("a proper link runs commands and answers each, sealed") {
  Served s;
  auto cipher = LinkCipher::Create(std::string(32, 'x'), Direction::kToAgent);
  int fd = OpenLink(s, &*cipher);
  CHECK(RunOn(fd, &*cipher, 7, 41) == "ran 41");
  CHECK(RunOn(fd, &*cipher, 8, 42) == "ran 42");
  CHECK(s.ran == 2);
  CHECK(s.server->open_links() == 1);
  ::close(fd);
}

TEST_CASE("connections without a granted id or the key run nothing") {
  Served s;
  SECTION("garbage instead of a hello") {
    int fd = Connect(s.server->port());
    Write(fd, std::string(steplink::kHelloBytes, 'A'));
    CHECK(ClosedByServer(fd));
    ::close(fd);
  }
  SECTION("a granted id with a hello sealed under another key") {
    auto g = s.server->Issue();
    REQUIRE(g.ok());
    auto wrong = LinkCipher::Create(std::string(32, '\x01'), Direction::kToAgent);
    int fd = Connect(s.server->port());
    Write(fd, Hello(*g, &*wrong) + Command(&*wrong, 1, 5));
    CHECK(ClosedByServer(fd));
    ::close(fd);
  }
  SECTION("a hello sealed as if by the agent (reflected direction)") {
    auto g = s.server->Issue();
    REQUIRE(g.ok());
    auto reflected = LinkCipher::Create(g->key, Direction::kToController);
    int fd = Connect(s.server->port());
    Write(fd, Hello(*g, &*reflected));
    CHECK(ClosedByServer(fd));
    ::close(fd);
  }
  SECTION("a grant used a second time") {
    auto g = s.server->Issue();
    REQUIRE(g.ok());
    auto c1 = LinkCipher::Create(g->key, Direction::kToAgent);
    int first = Connect(s.server->port());
    Write(first, Hello(*g, &*c1));
    std::string body;
    REQUIRE(ReadFrame(first, &body));  // accepted once
    auto c2 = LinkCipher::Create(g->key, Direction::kToAgent);
    int second = Connect(s.server->port());
    Write(second, Hello(*g, &*c2) + Command(&*c2, 1, 5));
    CHECK(ClosedByServer(second));
    ::close(first);
    ::close(second);
  }
  SECTION("an expired grant") {
    StepLinkOptions o;
    o.grant_lifetime = std::chrono::milliseconds(50);
    Served short_lived(o);
    auto g = short_lived.server->Issue();
    REQUIRE(g.ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    auto c = LinkCipher::Create(g->key, Direction::kToAgent);
    int fd = Connect(short_lived.server->port());
    Write(fd, Hello(*g, &*c) + Command(&*c, 1, 5));
    CHECK(ClosedByServer(fd));
    ::close(fd);
    CHECK(short_lived.ran == 0);
  }
  CHECK(s.ran == 0);
  // The one accepted link (a grant used twice) was closed by this end: none stays open.
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (s.server->open_links() != 0 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(s.server->open_links() == 0);
}

TEST_CASE("a link id replayed without the key does not use up the grant") {
  Served s;
  auto g = s.server->Issue();
  REQUIRE(g.ok());
  // Someone who saw the clear-text id on the wire sends it first, with a proof it cannot make.
  auto wrong = LinkCipher::Create(std::string(32, '\x01'), Direction::kToAgent);
  int rogue = Connect(s.server->port());
  Write(rogue, Hello(*g, &*wrong));
  CHECK(ClosedByServer(rogue));
  ::close(rogue);
  // The controller's own hello, after it, still opens the link.
  auto cipher = LinkCipher::Create(g->key, Direction::kToAgent);
  int fd = Connect(s.server->port());
  Write(fd, Hello(*g, &*cipher));
  std::string body, plain;
  REQUIRE(ReadFrame(fd, &body));
  REQUIRE(cipher->Open(body, &plain).ok());
  CHECK(plain.empty());
  CHECK(RunOn(fd, &*cipher, 1, 9) == "ran 9");
  ::close(fd);
}

TEST_CASE("a forged, replayed or oversized frame on an open link closes it unrun") {
  Served s;
  auto cipher = LinkCipher::Create(std::string(32, 'x'), Direction::kToAgent);
  int fd = OpenLink(s, &*cipher);
  const std::string frame = Command(&*cipher, 1, 9);
  SECTION("one flipped byte") {
    std::string forged = frame;
    forged[steplink::kLengthBytes + 2] ^= 0x40;
    Write(fd, forged);
    CHECK(ClosedByServer(fd));
    CHECK(s.ran == 0);
  }
  SECTION("a frame sent twice") {
    Write(fd, frame);
    std::string body;
    REQUIRE(ReadFrame(fd, &body));
    CHECK(s.ran == 1);
    Write(fd, frame);  // replayed: the agent expects the next count
    CHECK(ClosedByServer(fd));
    CHECK(s.ran == 1);
  }
  SECTION("a length over the limit") {
    std::string huge(4, '\0');
    const uint32_t n = steplink::kMaxFrameBody + 1;
    for (int i = 0; i < 4; ++i) huge[i] = static_cast<char>(n >> (8 * i));
    Write(fd, huge);
    CHECK(ClosedByServer(fd));
  }
  SECTION("a sealed frame that is not a step command") {
    std::string junk;
    REQUIRE(cipher->Seal(std::string("\xff\xff\xff\xff", 4), &junk).ok());
    Write(fd, junk);
    CHECK(ClosedByServer(fd));
    CHECK(s.ran == 0);
  }
  ::close(fd);
  // The listener still serves a proper link.
  auto again = LinkCipher::Create(std::string(32, 'x'), Direction::kToAgent);
  int ok = OpenLink(s, &*again);
  CHECK(RunOn(ok, &*again, 1, 77) == "ran 77");
  ::close(ok);
}

TEST_CASE("silent connections end at the handshake deadline and are capped") {
  StepLinkOptions o;
  o.handshake_timeout = std::chrono::milliseconds(300);
  o.max_unauthenticated = 4;
  Served s(o);
  SECTION("one that never speaks") {
    int fd = Connect(s.server->port());
    const auto t0 = Clock::now();
    CHECK(ClosedByServer(fd));
    CHECK(Clock::now() - t0 < std::chrono::seconds(3));
    ::close(fd);
  }
  SECTION("more than the cap: the oldest go, a proper link still opens") {
    std::vector<int> idle;
    for (int i = 0; i < 12; ++i) idle.push_back(Connect(s.server->port()));
    auto cipher = LinkCipher::Create(std::string(32, 'x'), Direction::kToAgent);
    int fd = OpenLink(s, &*cipher);
    CHECK(RunOn(fd, &*cipher, 1, 3) == "ran 3");
    CHECK(ClosedByServer(idle.front()));  // among the oldest, closed for the cap
    for (int f : idle) ::close(f);
    ::close(fd);
  }
}

TEST_CASE("a new link beyond max_links closes the oldest one") {
  StepLinkOptions o;
  o.max_links = 1;
  Served s(o);
  auto c1 = LinkCipher::Create(std::string(32, 'x'), Direction::kToAgent);
  int first = OpenLink(s, &*c1);
  auto c2 = LinkCipher::Create(std::string(32, 'x'), Direction::kToAgent);
  int second = OpenLink(s, &*c2);
  CHECK(ClosedByServer(first));
  CHECK(RunOn(second, &*c2, 1, 5) == "ran 5");
  CHECK(s.server->open_links() == 1);
  ::close(first);
  ::close(second);
}

TEST_CASE("out of descriptors, the listener backs off instead of spinning, then accepts again") {
  Served s;
  size_t open_now = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++open_now;
  }
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
  rlimit low = old;
  low.rlim_cur = open_now + 4;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  // Every descriptor left goes to a client: the listener's accept fails with EMFILE while their
  // connections wait in its backlog.
  std::vector<int> clients;
  while (true) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(s.server->port());
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
      ::close(fd);
      break;
    }
    clients.push_back(fd);
  }
  REQUIRE_FALSE(clients.empty());
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  getrusage(RUSAGE_SELF, &after);
  auto ms = [](const timeval& t) { return t.tv_sec * 1000.0 + t.tv_usec / 1000.0; };
  const double cpu_ms =
      ms(after.ru_utime) + ms(after.ru_stime) - ms(before.ru_utime) - ms(before.ru_stime);
  for (int fd : clients) ::close(fd);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
  CHECK(cpu_ms < 200);  // a spinning accept loop burns the whole 500 ms
  // Descriptors are back: a proper link opens and runs.
  auto cipher = LinkCipher::Create(std::string(32, 'x'), Direction::kToAgent);
  int fd = OpenLink(s, &*cipher);
  CHECK(RunOn(fd, &*cipher, 1, 11) == "ran 11");
  ::close(fd);
  CHECK(s.ran == 1);
}

}  // namespace
}  // namespace wb::service
