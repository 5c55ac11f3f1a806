"""Orchard Env network policy cost: sandbox create → ready and delete with an egress allowlist (its own network
namespace, veth and nftables rules) against the same without one (baseline, alternated in the same run), and
SetNetworkPolicy on a live sandbox. Starts its own env service (`orchard serve env`); prints one JSON. No packet
is sent: the rule names a link-local address.

    python bench/env_network.py [--creates 30] [--image host]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import grpc
from env_service import env_service

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc

POLICY = pb.NetworkPolicy(allow=[pb.EgressRule(cidr="169.254.0.2/32", port=8080)])


def summary_ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(values) * 1e3, 1),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1e3, 1),
        "n": len(values),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=30)
    parser.add_argument("--image", default="host")
    args = parser.parse_args()

    times: dict[str, list[float]] = {
        "create": [],
        "create_policy": [],
        "delete": [],
        "delete_policy": [],
        "set_policy": [],
    }
    with env_service() as (address, _):
        with grpc.insecure_channel(address) as channel:
            stub = env_pb2_grpc.EnvServiceStub(channel)
            for i in range(2 * args.creates):
                suffix = "_policy" if i % 2 else ""
                start = time.perf_counter()
                sandbox = stub.CreateSandbox(
                    pb.CreateSandboxRequest(image=args.image, network_policy=POLICY if suffix else None), timeout=30
                ).sandbox
                times["create" + suffix].append(time.perf_counter() - start)
                if suffix:
                    start = time.perf_counter()
                    stub.SetNetworkPolicy(
                        pb.SetNetworkPolicyRequest(sandbox_id=sandbox.sandbox_id, network_policy=POLICY), timeout=30
                    )
                    times["set_policy"].append(time.perf_counter() - start)
                start = time.perf_counter()
                stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sandbox.sandbox_id), timeout=30)
                times["delete" + suffix].append(time.perf_counter() - start)

    s = {name: summary_ms(values) for name, values in times.items()}
    print(
        json.dumps(
            {
                "benchmark": "env_network",
                "image": args.image,
                "cpus": os.cpu_count(),
                "create_ready_no_policy": s["create"],
                "create_ready_with_policy": s["create_policy"],
                "create_p50_cost_ms": round(s["create_policy"]["p50_ms"] - s["create"]["p50_ms"], 1),
                "delete_no_policy": s["delete"],
                "delete_with_policy": s["delete_policy"],
                "set_network_policy": s["set_policy"],
            }
        )
    )


if __name__ == "__main__":
    main()
