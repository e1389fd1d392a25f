// Where the tcp rail's rate comes from (daemon/transport/tcp/link_rate.h): the setting, else
// the link speed the kernel states for the advertised address's interface (read from a sysfs
// folder the test writes), else the nominal rate with the reason.
#include "daemon/transport/tcp/link_rate.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "tests/support/process.h"

namespace wb::transport::tcp {
namespace {

namespace fs = std::filesystem;

// A fake /sys/class/net holding `iface`/speed = `speed` (as the kernel writes it).
std::string FakeSysfs(const std::string& root, const std::string& iface, const std::string& speed) {
  fs::create_directories(root + "/" + iface);
  std::ofstream(root + "/" + iface + "/speed") << speed << "\n";
  return root;
}

TEST_CASE("a configured rate wins over everything") {
  const LinkRate r = TcpLinkRate(12.5, "127.0.0.1", "/nonexistent");
  CHECK(r.gbps == 12.5);
  CHECK(r.source == "transports.tcp.gbps");
}

// A fresh folder (removed when the test exits).
struct Folder {
  std::string path = wb::testing::TempDir("wb-linkrate");
};

TEST_CASE("unset: the stated speed of the interface holding the address") {
  Folder dir;
  // 127.0.0.1 is on lo on every Linux machine; the real lo states no speed, the fake one does.
  const std::string sysfs = FakeSysfs(dir.path + "/net", "lo", "25000");
  const LinkRate r = TcpLinkRate(0, "127.0.0.1", sysfs);
  CHECK(r.gbps == Approx(25000.0 / 8000.0));
  CHECK_THAT(r.source, Catch::Contains("link speed of lo (25000 Mbit/s)"));
  // A host name resolves to its address first.
  const LinkRate named = TcpLinkRate(0, "localhost", sysfs);
  CHECK(named.gbps == Approx(3.125));
}

TEST_CASE("no stated speed, or no such local address: nominal, saying why") {
  Folder dir;
  SECTION("virtual links state -1") {
    const LinkRate r = TcpLinkRate(0, "127.0.0.1", FakeSysfs(dir.path + "/net", "lo", "-1"));
    CHECK(r.gbps == kNominalTcpGbps);
    CHECK_THAT(r.source, Catch::Contains("lo states no link speed") &&
                             Catch::Contains("set transports.tcp.gbps"));
  }
  SECTION("no speed file at all") {
    const LinkRate r = TcpLinkRate(0, "127.0.0.1", dir.path + "/empty");
    CHECK(r.gbps == kNominalTcpGbps);
    CHECK_THAT(r.source, Catch::Contains("states no link speed"));
  }
  SECTION("an address no interface here holds (TEST-NET-3)") {
    const LinkRate r = TcpLinkRate(0, "203.0.113.7", dir.path);
    CHECK(r.gbps == kNominalTcpGbps);
    CHECK_THAT(r.source, Catch::Contains("no local interface holds 203.0.113.7"));
  }
}

}  // namespace
}  // namespace wb::transport::tcp
