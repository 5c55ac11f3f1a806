"""Bootstrap of the reward service: settings → rubric, inference and env clients → gRPC server
(`orchard serve reward`)."""

from __future__ import annotations

from collections.abc import Sequence

from orchard.reward.v1 import reward_pb2_grpc
from orchard.runtime import GrpcServer
from orchard.runtime.main import run_service
from orchard.sdk import AsyncSandboxClient
from orchard.services.reward.judge import Judge
from orchard.services.reward.models import InferenceModels, Models
from orchard.services.reward.outcome import OutcomeGrader
from orchard.services.reward.rubric import load_rubric
from orchard.services.reward.servicer import RewardServicer
from orchard.services.reward.settings import RewardSettings
from orchard.services.reward.teacher import Teacher


def build(settings: RewardSettings, models: Models | None = None) -> GrpcServer:
    """A reward service ready to start. `models` defaults to the inference service at settings.inference_address
    (unit tests pass a scripted fake)."""
    rubric = load_rubric(settings.rubric_file)
    server = GrpcServer(settings, name="reward")
    if models is None:
        inference = InferenceModels(settings.inference_address, settings.max_message_bytes)
        server.on_stop(inference.close)
        models = inference
    # Grading runs for minutes; its own deadlines bound each call, so the client's per-call timeout is generous.
    env = AsyncSandboxClient(settings.env_address, timeout=settings.grade_timeout_s, auto_cleanup=True)
    servicer = RewardServicer(
        settings,
        rubric,
        OutcomeGrader(env, settings.max_concurrent_grades, settings.grade_timeout_s, settings.test_timeout_s),
        Judge(models, settings.max_concurrent_judges, settings.judge_timeout_s),
        Teacher(models, settings.max_concurrent_scores, settings.teacher_timeout_s),
    )
    server.add_service(reward_pb2_grpc.add_RewardServiceServicer_to_server, servicer, "orchard.reward.v1.RewardService")
    server.on_stop(env.close)
    return server


async def serve(settings: RewardSettings) -> None:
    await build(settings).serve()  # until SIGTERM/SIGINT: NOT_SERVING, drain, then the clients close


def main(argv: Sequence[str] | None = None) -> None:
    run_service("reward", RewardSettings, serve, argv)


if __name__ == "__main__":
    main()
