// Whether this controller may drive steps now, and its place in an election (issue 45). Without
// high availability there is no role: the controller always leads.
#pragma once

#include <grpcpp/grpcpp.h>

#include "weightbeam/v1/controller.pb.h"

namespace wb::controller {

class ControllerRole {
 public:
  virtual ~ControllerRole() = default;
  // OK while this controller leads and is ready; else UNAVAILABLE naming the leader (a client
  // moves on to it).
  virtual grpc::Status MayLead() const = 0;
  virtual weightbeam::v1::Leadership Describe() const = 0;
};

}  // namespace wb::controller
