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

TEST_CASE("a buffer registered once admits writes only inside its open windows",
          "[region_table][windows]") {
  RegionTable table("test");
  std::vector<uint8_t> memory(1000);
  auto buf = table.Add(MemoryRef{memory.data(), memory.size()}, Access::kDestination,
                       /*windowed=*/true);
  REQUIRE(buf.ok());
  // No tensor yet: nothing of the buffer can be written.
  CHECK(table.PinRemoteWrite(buf->id, buf->key, 0, 4).status().code() ==
        absl::StatusCode::kPermissionDenied);
  REQUIRE(table.OpenWindow(buf->id, 0, 100).ok());    // tensor a
  REQUIRE(table.OpenWindow(buf->id, 100, 100).ok());  // tensor b, adjacent
  REQUIRE(table.OpenWindow(buf->id, 500, 50).ok());   // tensor c
  CHECK(table.PinRemoteWrite(buf->id, buf->key, 10, 90).ok());
  CHECK(table.PinRemoteWrite(buf->id, buf->key, 500, 50).ok());
  CHECK(table.PinRemoteWrite(buf->id, buf->key, 0, 200).ok());  // two live tensors
  auto gap = table.PinRemoteWrite(buf->id, buf->key, 190, 20);  // into bytes no tensor holds
  CHECK(gap.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(gap.status().message()),
             Catch::Contains("outside its registered tensors"));
  CHECK(table.PinRemoteWrite(buf->id, buf->key + 1, 10, 1).status().code() ==
        absl::StatusCode::kPermissionDenied);

  // Tensor a is withdrawn; the buffer stays registered for b and c.
  REQUIRE(table.CloseWindow(buf->id, 0, 100).ok());
  CHECK(table.PinRemoteWrite(buf->id, buf->key, 0, 4).status().code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(table.PinRemoteWrite(buf->id, buf->key, 99, 2).status().code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(table.PinLocal(buf->id, 0, 4).status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(table.PinRemoteWrite(buf->id, buf->key, 100, 100).ok());
  CHECK(table.size() == 1);
  // A window closed twice, or never opened, is an error.
  CHECK(table.CloseWindow(buf->id, 0, 100).code() == absl::StatusCode::kInvalidArgument);
  CHECK(table.OpenWindow(buf->id, 990, 11).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("windows over the same bytes are counted", "[region_table][windows]") {
  RegionTable table("test");
  std::vector<uint8_t> memory(256);
  auto buf = table.Add(MemoryRef{memory.data(), memory.size()}, Access::kDestination, true);
  REQUIRE(buf.ok());
  REQUIRE(table.OpenWindow(buf->id, 0, 200).ok());  // a replica's tensor
  REQUIRE(table.OpenWindow(buf->id, 50, 50).ok());  // a copy nested inside it
  REQUIRE(table.CloseWindow(buf->id, 0, 200).ok());
  CHECK(table.PinRemoteWrite(buf->id, buf->key, 50, 50).ok());
  CHECK(table.PinRemoteWrite(buf->id, buf->key, 0, 10).status().code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(table.PinRemoteWrite(buf->id, buf->key, 100, 10).status().code() ==
        absl::StatusCode::kPermissionDenied);
  REQUIRE(table.CloseWindow(buf->id, 50, 50).ok());
  CHECK(table.PinRemoteWrite(buf->id, buf->key, 50, 50).status().code() ==
        absl::StatusCode::kPermissionDenied);
}

TEST_CASE("closing a window waits for writes in progress, not for later ones",
          "[region_table][windows]") {
  RegionTable table("test");
  std::vector<uint8_t> memory(256);
  auto buf = table.Add(MemoryRef{memory.data(), memory.size()}, Access::kDestination, true);
  REQUIRE(buf.ok());
  REQUIRE(table.OpenWindow(buf->id, 0, 100).ok());
  REQUIRE(table.OpenWindow(buf->id, 100, 100).ok());
  auto landing = table.PinRemoteWrite(buf->id, buf->key, 0, 100);
  REQUIRE(landing.ok());
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    REQUIRE(table.CloseWindow(buf->id, 0, 100).ok());
    closed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(closed.load());  // the write into the tensor is still landing
  // A write into the other tensor, pinned after the close began, neither waits nor blocks it.
  auto other = table.PinRemoteWrite(buf->id, buf->key, 100, 100);
  REQUIRE(other.ok());
  landing = RegionTable::Pin();
  closer.join();
  CHECK(closed.load());
}

}  // namespace
}  // namespace wb::transport
