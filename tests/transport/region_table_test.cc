// The region table: keys, access, bounds, and withdrawal that waits for writes in progress.
#include "daemon/transport/region_table.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

namespace wb::transport {
namespace {

TEST_CASE("regions get distinct ids and distinct non-zero random keys", "[region_table]") {
  RegionTable table("test");
  std::vector<uint8_t> memory(1024);
  std::set<uint64_t> ids, keys;
  for (int i = 0; i < 100; ++i) {
    auto info = table.Add(MemoryRef{memory.data(), memory.size()}, Access::kDestination);
    REQUIRE(info.ok());
    ids.insert(info->id);
    keys.insert(info->key);
    CHECK(info->key != 0);
  }
  CHECK(ids.size() == 100);
  CHECK(keys.size() == 100);
}

TEST_CASE("remote writes are checked for key, access and bounds", "[region_table]") {
  RegionTable table("test");
  std::vector<uint8_t> memory(1000);
  auto dst = table.Add(MemoryRef{memory.data(), memory.size()}, Access::kDestination);
  auto src = table.Add(MemoryRef{memory.data(), memory.size()}, Access::kSource);
  REQUIRE(dst.ok());
  REQUIRE(src.ok());

  auto pin = table.PinRemoteWrite(dst->id, dst->key, 100, 900);
  REQUIRE(pin.ok());
  CHECK(pin->data() == memory.data() + 100);

  auto wrong_key = table.PinRemoteWrite(dst->id, dst->key + 1, 0, 10);
  CHECK(wrong_key.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(wrong_key.status().message()), Catch::Contains("wrong key"));

  auto past_end = table.PinRemoteWrite(dst->id, dst->key, 100, 901);
  CHECK(past_end.status().code() == absl::StatusCode::kOutOfRange);
  CHECK_THAT(std::string(past_end.status().message()), Catch::Contains("length 1000"));

  auto wraps = table.PinRemoteWrite(dst->id, dst->key, ~uint64_t{0}, 2);
  CHECK(wraps.status().code() == absl::StatusCode::kOutOfRange);

  auto to_source = table.PinRemoteWrite(src->id, src->key, 0, 10);
  CHECK(to_source.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(to_source.status().message()),
             Catch::Contains("not registered as a destination"));

  CHECK(table.PinRemoteWrite(12345, dst->key, 0, 1).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("an empty region cannot be registered", "[region_table]") {
  RegionTable table("test");
  CHECK(table.Add(MemoryRef{}, Access::kDestination).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Remove waits for a write in progress, then refuses new ones", "[region_table]") {
  RegionTable table("test");
  std::vector<uint8_t> memory(64);
  auto dst = table.Add(MemoryRef{memory.data(), memory.size()}, Access::kDestination);
  REQUIRE(dst.ok());
  auto pin = table.PinRemoteWrite(dst->id, dst->key, 0, 64);
  REQUIRE(pin.ok());

  std::atomic<bool> removed{false};
  std::thread remover([&] {
    REQUIRE(table.Remove(dst->id).ok());
    removed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK_FALSE(removed);  // still pinned: Remove must not have returned
  // New writes are refused already while the old one finishes.
  CHECK(table.PinRemoteWrite(dst->id, dst->key, 0, 1).status().code() ==
        absl::StatusCode::kNotFound);
  *pin = RegionTable::Pin();  // the write in progress ends
  remover.join();
  CHECK(removed);
  CHECK(table.Remove(dst->id).code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace wb::transport
