"""A CPU vLLM server's start: the engine core forked (``engine_main``, what ``VLLMServer`` runs)
against spawned (``python -m vllm.entrypoints.openai.api_server``, vLLM's own way on CPU).

Both start the same tiny random Llama with its LoRA adapter and the same flags, taking turns over
several rounds; each start is timed to ``/health`` and its CPU (server and engine core) is read
there. Medians and their ratio are printed.

    python scripts/benchmarks/bench_start.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from groundcover.serving.launch.registry import LoraAdapter
from groundcover.serving.launch.server import ServerSpec, VLLMServer, engine_args


class SpawningServer(VLLMServer):
    """vLLM's module as it is: its CPU platform spawns the engine core."""

    def command(self) -> list[str]:
        where = ["--host", self.spec.host, "--port", str(self.port)]
        module = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        return [*module, *where, *engine_args(self.spec, self.device)]


def start_once(kind: type[VLLMServer], spec: ServerSpec, log: Path) -> tuple[float, float]:
    server = kind(spec, log)
    began = time.perf_counter()
    server.start()
    seconds = time.perf_counter() - began
    assert server.process is not None
    root = psutil.Process(server.process.pid)
    cpu = sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])
    server.stop()
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.support.tiny import build_tiny_llama, build_tiny_lora

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_llama(Path(tmp) / "tiny-llama")
        lora = build_tiny_lora(model, Path(tmp) / "claims")
        adapter = LoraAdapter(name="claims", path=str(lora), base=model.name, rank=8)
        spec = ServerSpec(model=str(model), loras=[adapter], device="cpu")
        kinds = {"forked": VLLMServer, "spawned": SpawningServer}
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in kinds}
        for n in range(args.rounds):
            for name, kind in kinds.items():  # taking turns: the machine's drift hits both
                runs[name].append(start_once(kind, spec, Path(tmp) / f"{name}{n}.log"))
                print(f"round {n} {name}: {runs[name][-1][0]:.1f} s, {runs[name][-1][1]:.1f} CPU-s")
    medians = {
        name: (statistics.median(s for s, _ in r), statistics.median(c for _, c in r))
        for name, r in runs.items()
    }
    print("engine core | start to /health, median | CPU-s, median")
    for name, (seconds, cpu) in medians.items():
        print(f"{name:11} | {seconds:.1f} s | {cpu:.1f}")
    (fs, fc), (ss, sc) = medians["forked"], medians["spawned"]
    print(f"forked / spawned: {fs / ss:.2f}x the time, {fc / sc:.2f}x the CPU")


if __name__ == "__main__":
    main()
