"""The `orchard` command: run the local stack, serve one service, manage sandboxes and images."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from orchard.errors import OrchardError
from orchard.runtime.settings import SettingsError


def _pairs(values: list[str] | None, what: str) -> dict[str, str]:
    result = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"orchard: {what} must look like KEY=VALUE, got {item!r}")
        result[key] = value
    return result


def _client(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from orchard.sdk import SandboxClient

    return SandboxClient(target=args.address, auto_cleanup=False)


def cmd_up(args: argparse.Namespace) -> int:
    from orchard.cli.stack import up

    return asyncio.run(
        up(
            args.host,
            args.nats_port,
            args.env_port,
            Path(args.state_dir),
            args.log_format,
            inference_port=None if args.no_inference else args.inference_port,
            inference_http_port=args.inference_http_port,
            model=args.model,
            experience_port=None if args.no_experience else args.experience_port,
            trainer_port=None if args.no_trainer else args.trainer_port,
            value_port=None if args.no_value else args.value_port,
            value_checkpoint=Path(args.value_checkpoint) if args.value_checkpoint else None,
        )
    )


def cmd_serve(args: argparse.Namespace) -> int:
    from orchard.cli.stack import serve

    serve(args.service, args.service_args)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from orchard.cli.status import print_rows, status

    rows = asyncio.run(
        status(
            args.env_address,
            args.nats_address,
            args.token,
            args.inference_address or None,
            args.experience_address or None,
            args.trainer_address or None,
            args.value_address or None,
        )
    )
    print_rows(rows)
    return 0 if all(row.ok for row in rows) else 1


def cmd_sandbox_create(args: argparse.Namespace) -> int:
    with _client(args) as client:
        sandbox = client.create_sandbox(
            args.image, timeout=args.ttl, env=_pairs(args.env, "--env"), labels=_pairs(args.label, "--label")
        )
        print(sandbox.sandbox_id)
    return 0


def cmd_sandbox_ls(args: argparse.Namespace) -> int:
    with _client(args) as client:
        rows = [
            (s.sandbox_id, s.image, s.info.state, ",".join(f"{k}={v}" for k, v in sorted(s.info.labels.items())))
            for s in client.list_sandboxes(labels=_pairs(args.label, "--label"))
        ]
    print(f"{'SANDBOX':<20} {'IMAGE':<20} {'STATE':<10} LABELS")
    for row in rows:
        print(f"{row[0]:<20} {row[1]:<20} {row[2]:<10} {row[3]}")
    return 0


def cmd_sandbox_exec(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("orchard sandbox exec: give a command after the sandbox id, e.g. -- ls -la")
    with _client(args) as client:
        sandbox = client.get_sandbox(args.sandbox_id)
        # One argument is a shell line (pipes work); several are an argv, quoted for bash by the service.
        handle = sandbox.exec_async(command[0] if len(command) == 1 else command, timeout=args.timeout)
        for stream, data in handle.stream():
            out = sys.stdout if stream == "stdout" else sys.stderr
            out.buffer.write(data)
            out.flush()
        result = handle.wait()
    if result.error:
        print(f"orchard: {result.error}", file=sys.stderr)
    code = result.exit_code if result.exit_code is not None else 1
    return code if 0 <= code < 256 else 1


def cmd_sandbox_rm(args: argparse.Namespace) -> int:
    with _client(args) as client:
        for sandbox_id in args.sandbox_ids:
            client.delete_sandbox(sandbox_id)
            print(sandbox_id)
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    from orchard.cli.stack import run_tool

    return run_tool("image", args.image_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="start the local stack (nats-server + services) in the foreground")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--nats-port", type=int, default=4222)
    p.add_argument("--env-port", type=int, default=50051)
    p.add_argument("--state-dir", default=str(Path.home() / ".local" / "state" / "orchard" / "stack"))
    p.add_argument("--log-format", choices=["json", "text"], default="text")
    p.add_argument("--inference-port", type=int, default=50052, help="gRPC port of the inference service")
    p.add_argument(
        "--model",
        default="",
        help="the model the inference service serves: a Hugging Face folder, a .gguf file, or `student` (a 6.5 M "
        "parameter model initialised here, for learning on a CPU; the main job trains it) (default: the embedded "
        "SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--inference-http-port",
        type=int,
        default=50080,
        help="port of the inference service's OpenAI-compatible endpoint (/v1)",
    )
    p.add_argument(
        "--no-inference",
        action="store_true",
        help="do not start the inference service (it loads the embedded model, ~0.5 GB of memory)",
    )
    p.add_argument(
        "--experience-port",
        type=int,
        default=50055,
        help="gRPC port of the experience service (rollout events -> SQLite under --state-dir)",
    )
    p.add_argument("--no-experience", action="store_true", help="do not start the experience service")
    p.add_argument(
        "--trainer-port",
        type=int,
        default=50056,
        help="gRPC port of the trainer service (jobs under --state-dir/trainer; it starts with the experience "
        "service, and RL jobs need the inference service too)",
    )
    p.add_argument("--no-trainer", action="store_true", help="do not start the trainer service")
    p.add_argument(
        "--value-port",
        type=int,
        default=50057,
        help="gRPC port of the value service (scores and reranks candidates with a value model)",
    )
    p.add_argument("--no-value", action="store_true", help="do not start the value service")
    p.add_argument(
        "--value-checkpoint",
        default=None,
        help="value checkpoint the value service serves from the start (else none until LoadModel)",
    )
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("serve", help="run one service (flags after the name go to the service; --help lists them)")
    p.add_argument("service")
    p.add_argument("service_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("status", help="health of the local stack at a glance (exit 1 if anything is down)")
    p.add_argument("--env-address", default="127.0.0.1:50051")
    p.add_argument("--nats-address", default="127.0.0.1:4222")
    p.add_argument(
        "--inference-address",
        default="",
        help="also check the inference service there (orchard up serves it on 127.0.0.1:50052)",
    )
    p.add_argument(
        "--experience-address",
        default="",
        help="also check the experience service there (orchard up serves it on 127.0.0.1:50055)",
    )
    p.add_argument(
        "--trainer-address",
        default="",
        help="also check the trainer service there (orchard up serves it on 127.0.0.1:50056)",
    )
    p.add_argument(
        "--value-address",
        default="",
        help="also check the value service there (orchard up serves it on 127.0.0.1:50057)",
    )
    p.add_argument("--token", default=None, help="bearer token, when the services require one")
    p.set_defaults(func=cmd_status)

    sandbox = sub.add_parser("sandbox", help="create, list, run commands in, and delete sandboxes")
    sandbox.add_argument(
        "--address", default=None, help="env service address (default: ORCHARD_ENV_ADDRESS or 127.0.0.1:50051)"
    )
    ssub = sandbox.add_subparsers(dest="action", required=True)
    p = ssub.add_parser("create", help="create a sandbox and print its id")
    p.add_argument("image")
    p.add_argument("--ttl", type=float, default=3600, help="lifetime in seconds")
    p.add_argument("--env", action="append", metavar="KEY=VALUE")
    p.add_argument("--label", action="append", metavar="KEY=VALUE")
    p.set_defaults(func=cmd_sandbox_create)
    p = ssub.add_parser("ls", help="list sandboxes")
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="only sandboxes with this label")
    p.set_defaults(func=cmd_sandbox_ls)
    p = ssub.add_parser("exec", help="run a command in a sandbox, streaming its output; exits with its code")
    p.add_argument("sandbox_id")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_sandbox_exec)
    p = ssub.add_parser("rm", help="delete sandboxes")
    p.add_argument("sandbox_ids", nargs="+")
    p.set_defaults(func=cmd_sandbox_rm)

    # The env service's image tool (orchard.services.env.image_cli), started through its entry point.
    p = sub.add_parser(
        "image", help="build, import and list local sandbox images (`orchard image --help`)", add_help=False
    )
    p.add_argument("image_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_image)

    # These import their heavy parts only when run.
    from orchard.cli import eval as eval_cli
    from orchard.cli import learn as learn_cli
    from orchard.cli import rollout as rollout_cli
    from orchard.cli import tasks as tasks_cli
    from orchard.cli import train as train_cli

    rollout_cli.add_parser(sub)
    eval_cli.add_parser(sub)
    train_cli.add_parser(sub)
    learn_cli.add_parser(sub)
    tasks_cli.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["image"]:  # a service's own tool: its parser handles every flag, --help included
        from orchard.cli.stack import run_tool

        sys.exit(run_tool("image", given[1:]))
    args = build_parser().parse_args(given)
    try:
        code = args.func(args)
    except OrchardError as err:
        print(f"orchard: {err.message}", file=sys.stderr)
        code = 1
    except SettingsError as err:
        print(f"orchard: {err}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
