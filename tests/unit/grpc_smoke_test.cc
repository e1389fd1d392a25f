// gRPC smoke test: a real in-process server on 127.0.0.1:0, one unary and one streaming call.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>

#include "weightbeam/v1/controller.grpc.pb.h"

namespace v1 = weightbeam::v1;

namespace {

class SmokeController final : public v1::Controller::CallbackService {
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest*,
                                   v1::StatusResponse* resp) override {
    resp->set_version("smoke");
    resp->set_last_committed_version(41);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  // Streams three step results, then ends.
  grpc::ServerWriteReactor<v1::StepResult>* WatchSteps(grpc::CallbackServerContext*,
                                                       const v1::WatchStepsRequest*) override {
    class Writer : public grpc::ServerWriteReactor<v1::StepResult> {
     public:
      Writer() { Next(); }
      void OnWriteDone(bool ok) override {
        if (ok)
          Next();
        else
          Finish(grpc::Status::CANCELLED);
      }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (sent_ == 3) return Finish(grpc::Status::OK);
        result_.set_version(++sent_);
        result_.set_ok(true);
        StartWrite(&result_);
      }
      int sent_ = 0;
      v1::StepResult result_;
    };
    return new Writer();
  }
};

}  // namespace

TEST_CASE("gRPC unary and server-streaming calls over loopback") {
  SmokeController service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  REQUIRE(server);
  REQUIRE(port > 0);

  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = v1::Controller::NewStub(channel);

  grpc::ClientContext ctx;
  v1::StatusResponse resp;
  REQUIRE(stub->Status(&ctx, v1::StatusRequest(), &resp).ok());
  CHECK(resp.version() == "smoke");
  CHECK(resp.last_committed_version() == 41);

  grpc::ClientContext sctx;
  auto reader = stub->WatchSteps(&sctx, v1::WatchStepsRequest());
  std::vector<uint64_t> versions;
  v1::StepResult r;
  while (reader->Read(&r)) versions.push_back(r.version());
  CHECK(reader->Finish().ok());
  CHECK(versions == std::vector<uint64_t>{1, 2, 3});
  server->Shutdown();
}
