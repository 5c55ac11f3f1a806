"""Every benchmark runs end to end at a tiny size and prints one JSON object (so they keep working)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from env_helpers import needs_sandboxes

from orchard.services.env.settings import EnvSettings

BENCH = Path(__file__).resolve().parents[2] / "bench"
CHROMIUM = EnvSettings.model_fields["browser_path"].default
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def run_bench(script: str, args: list[str], key: str) -> dict[str, Any]:
    """Run bench/<script>; it exits 0 and its stdout is exactly one JSON object with `key`."""
    run = subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=280, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert isinstance(report, dict) and key in report
    return report


@needs_sandboxes
@pytest.mark.parametrize(
    ("script", "args", "key"),
    [
        ("env_latency.py", ["--execs", "20", "--creates", "3", "--clients", "4", "--rounds", "2"], "exec_true_sdk"),
        ("env_stress.py", ["--sandboxes", "12", "--concurrency", "4", "--image", "host"], "success_rate"),
        ("env_network.py", ["--creates", "2"], "create_ready_with_policy"),
        ("env_fork.py", ["--snapshots", "1", "--creates", "2", "--image", "host"], "images"),
        ("env_peers.py", ["--rounds", "1", "--block", "4", "--create-block", "1"], "exec_true_p50_ms"),
        ("task_factory.py", ["--max-candidates", "4"], "tasks_per_hour"),
    ],
)
def test_benchmark_prints_one_json_object(script: str, args: list[str], key: str) -> None:
    """The benchmark exits 0 and its stdout is exactly one JSON object with its main figure."""
    report = run_bench(script, args, key)
    if key == "success_rate":
        assert report["success_rate"] == 1.0, report
    if key == "tasks_per_hour":
        assert report["tried"] == 4 and report["validated"] == report["kept"] > 0, report
    if key == "exec_true_p50_ms":
        assert {"orchard_sdk_exec", "subprocess_run", "bwrap_per_command", "swerex_execute"} <= set(report[key])


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"browser sandboxes need {CHROMIUM} (apt-get install chromium)"
)
def test_browser_benchmark() -> None:
    """Every browser figure comes with its direct-Playwright baseline from the same run, and the memory line
    predicts the memory with a second Chromium process (2 contexts per process) within 50 %."""
    report = run_bench(
        "browser.py",
        [
            "--creates",
            "2",
            "--actions",
            "1",
            "--screenshots",
            "2",
            "--concurrent",
            "2",
            "--memory-sandboxes",
            "2",
            "--verify-sandboxes",
            "3",
            "--contexts-per-process",
            "2",
        ],
        "cold_start_ms",
    )
    assert float(report["cold_start_ms"]) > 0 and float(report["baseline_direct_cold_start_ms"]) > 0, report
    assert float(report["create_p50_ratio_to_baseline"]) > 0, report
    actions, shots, memory = report["actions"], report["screenshots_per_s"], report["memory"]
    assert isinstance(actions, dict) and isinstance(shots, dict) and isinstance(memory, dict)
    assert set(actions) == {"navigate", "type", "key_press", "click", "scroll", "get_page_content"}, report
    assert all(a["sdk"]["p50_ms"] > 0 and a["baseline_direct"]["p50_ms"] > 0 for a in actions.values()), report
    assert shots["one_sandbox"]["sdk_per_s"] > 0 and shots["concurrent"]["baseline_direct_per_s"] > 0, report
    assert memory["marginal_mib_per_sandbox"] > 0 and memory["fits_in_8_gib"] > 0, report
    assert memory["baseline_direct"]["marginal_mib_per_context"] > 0, report
    assert abs(memory["verify"]["error_pct"]) < 50, report


def test_experience_ingest_benchmark() -> None:
    """Needs only nats-server (installed with the package), not sandboxes; every event published is stored, and
    raw publish and publish → stored row alternate in blocks, each reported, with the load at start and end."""
    report = run_bench("experience_ingest.py", ["--events", "2000", "--rounds", "4"], "stored_events_per_s")
    assert report["events"] == 2000 and report["stored_events_per_s"] > 0, report
    blocks = report["blocks"]
    assert isinstance(blocks, list) and [b["round"] for b in blocks] == [0, 1, 2, 3], report
    assert all(b["raw_publish_per_s"] > 0 and b["stored_per_s"] > 0 for b in blocks), report
    assert float(report["ratio_stored_to_raw_publish"]) > 0 and len(report["loadavg_end"]) == 3, report
    assert float(report["cpu_ratio_raw_to_orchard"]) > 0 and all(b["cpu_ratio"] > 0 for b in blocks), report


def test_inference_throughput_benchmark() -> None:
    """The service and the in-process baseline generate the same number of tokens; the ratio is printed."""
    report = run_bench("inference_throughput.py", ["--requests", "2", "--max-tokens", "4"], "ratio")
    service, baseline = report["service"], report["sequential_generate"]
    assert isinstance(service, dict) and isinstance(baseline, dict)
    assert service["tokens"] == baseline["tokens"] == 8, report
    assert float(report["ratio"]) > 0


@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="the inference peers bench needs llama-cpp-python (ORCHARD_LLAMA_CPP=1 bash scripts/install.sh builds it; scripts/test.sh does)",
)
def test_inference_peers_benchmark() -> None:
    """Both Orchard engines and llama.cpp's own API alternate in blocks, the order rotating by round; every block has
    its figures, and the ratios, the log-prob gap and the load average come with them."""
    args = ["--rounds", "2", "--singles", "1", "--concurrent", "2", "--max-tokens", "4"]
    report = run_bench("inference_peers.py", args, "ratio_over_peer")
    names = ["orchard_transformers", "orchard_llama_cpp", "llama_cpp_python"]
    blocks = report["blocks"]
    assert [(b["round"], b["contender"], b["kind"]) for b in blocks] == [
        (r, name, kind) for r in (0, 1) for name in names[r:] + names[:r] for kind in ("single", "concurrent")
    ], blocks
    assert all(b["tokens"] > 0 for b in blocks) and all(b["decode_tokens_per_s"] > 0 for b in blocks[::2]), blocks
    for name in names[:2]:
        assert set(report["ratio_over_peer"][name]) == {"decode", "ttft", "aggregate"}, report
        assert all(float(v) > 0 for v in report["ratio_over_peer"][name].values()), report
    assert report["logprob_gap_llama_cpp_vs_transformers_score"]["tokens"] == 8 * 4, report
    assert len(report["loadavg_start"]) == len(report["loadavg_end"]) == 3, report


def test_learning_proofs_benchmark() -> None:
    """CPU only, one seed at tiny sizes: every recipe's figure comes with its baseline from the same run."""
    report = run_bench(
        "learning_proofs.py",
        ["--seeds", "1", "--env-steps", "3000", "--sft-samples", "10", "--opd-steps", "2", "--rpr-groups", "8"],
        "bar_grpo",
    )
    bar, ca_sft, opd, rpr = report["bar_grpo"], report["ca_sft"], report["opd"], report["rpr"]
    assert isinstance(bar, dict) and isinstance(ca_sft, dict) and isinstance(opd, dict) and isinstance(rpr, dict)
    assert bar["env_step_budget"] == 3000 and isinstance(bar["baseline_fixed_n"], dict), report
    assert 0 <= ca_sft["baseline_resolved_only"] <= 1 and ca_sft["ratio"] > 0, report
    assert opd["steps"] == 2 and opd["kl_before"] > 0, report
    assert rpr["groups"] == 8 and rpr["baseline_outcome_only_all_failed_spread_fraction"] in (0, None), report


def test_trainer_step_benchmark() -> None:
    """A real trainer job and the bare loop train the same tiny model on the same batches; the ratio is printed."""
    report = run_bench("trainer_step.py", ["--tiny", "--steps", "2", "--samples", "4", "--tokens", "32"], "ratio")
    job, bare = report["job"], report["bare_loop"]
    assert isinstance(job, dict) and isinstance(bare, dict)
    assert job["steps"] == bare["steps"] == 2, report
    assert float(report["ratio"]) > 0 and job["wall_s"] > 0


def test_value_proofs_benchmark(tmp_path: Path) -> None:
    """CPU only, one seed at tiny sizes: best@8 comes with random@8 from the same run, and the plot is written."""
    png = tmp_path / "best_of_n.png"
    report = run_bench("value_proofs.py", ["--quick", "--plot", str(png)], "best@8")
    assert report["seeds"] == 1 and report["eval_tasks"] == 8 and report["candidates_per_task"] == 8, report
    assert 0 <= report["random@8"] <= report["pass@8"] <= 1 and report["ratio_best_to_random_at_8"] > 0, report
    assert [row["n"] for row in report["curve"]] == [1, 2, 4, 8], report
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
