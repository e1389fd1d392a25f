#include "daemon/staging/user_check.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wb::staging {

namespace v1 = weightbeam::v1;

namespace {

std::string UserName(std::optional<uid_t> owner) {
  return owner ? absl::StrCat("uid ", *owner) : "an unknown user";
}

}  // namespace

AckBook::Options CheckBookOptions() {
  AckBook::Options o;
  o.failed = "refused";
  o.timeout_setting = "VersionChecks.user_deadline_ms";
  o.leaving_fails = true;
  return o;
}

absl::Status RunUserCheck(AckBook* checks, const UserCheckEnvironment& env, uint64_t version,
                          std::chrono::milliseconds deadline) {
  std::set<std::optional<uid_t>> owners;
  for (const auto& t : env.destinations()) owners.insert(t->uid);
  if (owners.empty()) return absl::OkStatus();  // writes nothing here
  std::set<uint64_t> waited;
  std::map<std::optional<uid_t>, int> watchers_of;
  for (const AckBook::Entry& e : checks->Watching()) {
    if (!owners.count(e.owner)) continue;
    waited.insert(e.id);
    ++watchers_of[e.owner];
  }
  std::vector<std::string> unwatched;
  for (const auto& owner : owners) {
    if (!watchers_of.count(owner)) unwatched.push_back(UserName(owner));
  }
  if (!unwatched.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "user check of version ", version, ": no check watcher of ", absl::StrJoin(unwatched, ", "),
        " is watching (the plan asks for a user check: each user whose tensors a version "
        "writes watches with check, e.g. LocalSession.check_versions)"));
  }
  for (const auto& [owner, n] : watchers_of) {
    v1::Event check;
    check.set_kind(v1::Event::KIND_CHECK);
    check.set_version(version);
    check.set_reason(ReadyAudience(owner));
    for (auto& o : env.staged_objects(owner)) *check.add_staged() = std::move(o);
    env.publish(check);
  }
  absl::Status answered = checks->Wait(version, deadline, waited);
  if (answered.ok()) return answered;
  return absl::FailedPreconditionError(
      absl::StrCat("user check of version ", version, ": ", answered.message()));
}

}  // namespace wb::staging
