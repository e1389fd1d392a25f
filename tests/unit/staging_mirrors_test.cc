// Staging mirrors (daemon/staging/staging_mirrors.h): each user hears of its own staging
// objects only, the mirrors of withdrawn tensors are pruned, and a live object shrunk under
// the first copy fails the registration instead of killing the agent (issue 41, items 2, 11).
#include "daemon/staging/staging_mirrors.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

using wb::registry::Caller;
using wb::registry::OpenedMemory;
using wb::staging::StagingMirrors;

namespace {

OpenedMemory Live(void* data, uint64_t length, const std::string& name) {
  OpenedMemory m;
  m.ref = {data, length, wb::transport::MemoryKind::kHost, 0};
  m.buffer = m.ref;
  m.location = "host";
  m.shm_name = name;
  return m;
}

Caller Of(uid_t uid) {
  Caller c;
  c.known = true;
  c.uid = uid;
  c.gid = uid;
  c.pid = getpid();
  return c;
}

}  // namespace

TEST_CASE("staging mirrors: each user's objects, pruned once withdrawn") {
  StagingMirrors mirrors(0);
  std::vector<uint8_t> a(4096, 7), b(4096, 9);
  auto ma = mirrors.Mirror(Live(a.data(), a.size(), "/a"), Of(1000));
  auto mb = mirrors.Mirror(Live(b.data(), b.size(), "/b"), Of(1001));
  REQUIRE(ma.ok());
  REQUIRE(mb.ok());
  REQUIRE(ma->has_value());
  // The mirror starts equal to live.
  CHECK(static_cast<const uint8_t*>((*ma)->ref.addr)[100] == 7);
  const auto mine = mirrors.HostObjects(uid_t{1000});
  REQUIRE(mine.size() == 1);
  CHECK(mine[0].shm_name() == "/a");
  CHECK(mirrors.HostObjects(uid_t{1001}).size() == 1);
  CHECK(mirrors.HostObjects(uid_t{1002}).empty());
  CHECK(mirrors.tracked() == 2);
  // Withdrawn (the registry drops the hold): pruned, and its bytes given back.
  ma->reset();
  mirrors.Forget();
  CHECK(mirrors.tracked() == 1);
  CHECK(mirrors.staged_bytes() == 4096);
}

TEST_CASE("staging mirrors: a live object shrunk before the first copy fails, not SIGBUS") {
  const int fd = memfd_create("wb-mirror-test", 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 8192) == 0);
  void* live = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(live != MAP_FAILED);
  REQUIRE(ftruncate(fd, 0) == 0);
  StagingMirrors mirrors(0);
  auto m = mirrors.Mirror(Live(live, 8192, "/shrunk"), Of(1000));
  REQUIRE_FALSE(m.ok());
  CHECK_THAT(std::string(m.status().message()), Catch::Contains("SIGBUS"));
  munmap(live, 8192);
  close(fd);
}
