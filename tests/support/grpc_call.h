// For Catch2 tests that talk to the daemons' services directly: one unary gRPC call on a
// generated stub under a deadline, and the check that a call was refused for the right reason.
#pragma once

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

namespace wb::testing {

// CallWithin(std::chrono::seconds(20), stub.get(), &Stub::Plan, req, &resp).
template <typename Stub, typename Request, typename Response>
grpc::Status CallWithin(std::chrono::milliseconds timeout, Stub* stub,
                        grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                     Response*),
                        const Request& request, Response* response) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  return (stub->*method)(&ctx, request, response);
}

// CHECKs that `status` has `code` and a message containing `words` (the message is shown).
inline void CheckRefused(const grpc::Status& status, grpc::StatusCode code,
                         const std::string& words) {
  INFO(status.error_message());
  CHECK(status.error_code() == code);
  CHECK_THAT(status.error_message(), Catch::Contains(words));
}

}  // namespace wb::testing
