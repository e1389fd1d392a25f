// The Local EngineLayout / SourceLayout / TrainerLayout RPCs' answers, from common/engines (the
// agent serves them; any client may call them instead of linking the layout code).
#pragma once

#include "absl/status/statusor.h"
#include "weightbeam/v1/local.pb.h"

namespace wb::engines {

absl::StatusOr<weightbeam::v1::EngineLayoutResponse> AnswerEngineLayout(
    const weightbeam::v1::EngineLayoutRequest& request);

absl::StatusOr<weightbeam::v1::SourceLayoutResponse> AnswerSourceLayout(
    const weightbeam::v1::SourceLayoutRequest& request);

absl::StatusOr<weightbeam::v1::TrainerLayoutResponse> AnswerTrainerLayout(
    const weightbeam::v1::TrainerLayoutRequest& request);

}  // namespace wb::engines
