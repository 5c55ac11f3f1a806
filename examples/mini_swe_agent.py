"""mini-swe-agent fixes the quick start's repository in an Orchard Env sandbox and prints the patch it submits.

    python examples/mini_swe_agent.py --api-base http://127.0.0.1:8000/v1 --model <model id> [--textbased]

The model is anything behind an OpenAI-compatible endpoint: `orchard serve inference --http-port 8000` (the
embedded SmolLM2-135M is too small to solve it with mini's stock prompts), vLLM, or a hosted API. Needs the env
service and image as the quick start does (`bash scripts/main.sh`), and `pip install 'mini-swe-agent==2.4.*'`.
"""

import argparse
from pathlib import Path

from orchard.integrations.mini_swe_agent import (
    OrchardEnvironment,
    mini_config,
    run_mini_swe_agent,
)

REPO = Path(__file__).resolve().parent / "quickstart_repo"
TASK = (
    "calc.median returns the upper middle value for a list of even length; it must return the mean of the "
    "two middle values. The tests in tests/ show it."
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Run mini-swe-agent on Orchard Env against an OpenAI-compatible endpoint."
    )
    parser.add_argument("--api-base", default="http://127.0.0.1:8000/v1", help="the endpoint's /v1 URL")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", help="the model id the endpoint serves")
    parser.add_argument("--api-key", default="orchard")
    parser.add_argument(
        "--textbased",
        action="store_true",
        help="actions in code blocks instead of tool calls (models without tool calling)",
    )
    parser.add_argument("--address", help="env service host:port (default: ORCHARD_ENV_ADDRESS, else 127.0.0.1:50051)")
    parser.add_argument("--image", default="python:3.11-slim")
    parser.add_argument("--step-limit", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, help="cap on each reply (small CPU models ramble on otherwise)")
    args = parser.parse_args()

    config = mini_config(
        args.model,
        args.api_base,
        api_key=args.api_key,
        textbased=args.textbased,
        image=args.image,
        address=args.address,
        step_limit=args.step_limit,
    )
    if args.max_tokens:
        config["model"]["model_kwargs"]["max_tokens"] = args.max_tokens
    with OrchardEnvironment(**config["environment"]) as env:
        # The repository goes where mini's SWE-bench prompts say it is, as a git checkout (they submit `git diff`).
        cwd = env.config.cwd
        for path in sorted(p for p in REPO.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            env.sandbox.upload_file(path, f"{cwd}/{path.relative_to(REPO)}")
        env.sandbox.exec(
            "git init -q && git add -A && git -c user.name=orchard -c user.email=orchard@localhost commit -qm start",
            cwd=cwd,
        )
        run = run_mini_swe_agent(TASK, config, env)
        tests = env.sandbox.exec("python -m pytest -q tests/", cwd=cwd, timeout=120)
    print(f"exit status: {run.exit_status} after {run.api_calls} model calls")
    print(run.submission or "(no patch submitted)")
    print(f"tests after the run: {'pass' if tests.exit_code == 0 else 'fail'}")


if __name__ == "__main__":
    main()
