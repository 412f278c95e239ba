import random
import socket
from pathlib import Path

import pytest

from groundcover.serving.launch.registry import PRESETS, LoraAdapter, UnknownModelError, resolve
from groundcover.serving.launch.server import (
    ServerSpec,
    ServerStartError,
    VLLMServer,
    free_port,
    lora_rank_for,
)


def test_presets_have_engine_arguments():
    gpt_oss = PRESETS["gpt-oss-20b"]
    assert (gpt_oss.reasoning, gpt_oss.reasoning_default) == ("effort", "medium")
    assert PRESETS["Llama-3.3-70B-Instruct"].tensor_parallel_size == 4
    assert PRESETS["Llama-3.1-8B-Instruct"].reasoning is None
    assert PRESETS["Qwen3-8B"].reasoning == "toggle"
    assert PRESETS["DeepSeek-R1-Distill-Qwen-7B"].reasoning == "always"
    assert resolve("openai/gpt-oss-20b").name == "gpt-oss-20b"  # hub id finds its preset
    assert resolve("qwen2.5-72b-instruct").name == "Qwen2.5-72B-Instruct"


def test_unknown_model_is_refused():
    with pytest.raises(UnknownModelError, match="unknown model"):
        resolve("no-such-model")


def test_lora_rank_rounds_up_to_a_supported_rank():
    adapters = [LoraAdapter(name="a", path="p", base="b", rank=r) for r in (4, 12)]
    assert lora_rank_for(adapters) == 16
    assert lora_rank_for(adapters[:1]) == 8


def test_cpu_command_line(tmp_path):
    spec = ServerSpec(
        model=str(tmp_path), loras=[LoraAdapter(name="claims", path="/a", base="x", rank=64)]
    )
    server = VLLMServer(spec, tmp_path / "log")
    server.device = "cpu"
    command = " ".join(server.command())
    assert "--host 127.0.0.1" in command  # loopback unless told otherwise
    assert "--distributed-executor-backend uni" in command
    assert "--enable-lora" in command and "--lora-modules claims=/a" in command
    assert "--max-lora-rank 64" in command
    assert server.environment()["OMP_NUM_THREADS"] == "1"


def test_gpu_command_line_uses_tensor_parallelism(tmp_path):
    server = VLLMServer(ServerSpec(model="Qwen2.5-72B-Instruct"), tmp_path / "log")
    server.device = "cuda"
    command = server.command()
    assert command[command.index("--tensor-parallel-size") + 1] == "4"
    assert "--enforce-eager" not in command
    assert "Qwen/Qwen2.5-72B-Instruct" in command


@pytest.mark.parametrize(
    ("model", "parser"),
    [
        ("gpt-oss-20b", "openai_gptoss"),
        ("Qwen3-8B", "qwen3"),
        ("DeepSeek-R1-Distill-Qwen-7B", "deepseek_r1"),
        ("Llama-3.1-8B-Instruct", None),
    ],
)
def test_a_reasoning_preset_is_served_with_its_reasoning_parser(tmp_path, model, parser):
    server = VLLMServer(ServerSpec(model=model), tmp_path / "log")
    server.device = "cuda"
    command = server.command()
    if parser is None:
        assert "--reasoning-parser" not in command
    else:
        assert command[command.index("--reasoning-parser") + 1] == parser
    # the same model on Ray Serve replicas: the engine gets the same parser
    from groundcover.serving.cluster.serve_app import llm_config

    engine = llm_config(ServerSpec(model=model), replicas=2, device="cuda").engine_kwargs
    assert engine.get("reasoning_parser") == parser


def test_engine_args_reach_serve_replicas_as_vllm_would_read_them():
    """``serve --engine-arg`` with ``--replicas``: vLLM's parser turns each flag into the engine
    keyword and type ``vllm serve`` would give it (a later flag wins over ours); a server flag
    has no place on a Serve replica and is refused, never dropped."""
    from groundcover.serving.cluster.serve_app import llm_config

    flags = ["--max-num-seqs", "1", "--enable-prefix-caching", "--max-model-len=1024"]
    spec = ServerSpec(model="Qwen2.5-72B-Instruct", extra_args=flags)
    engine = llm_config(spec, replicas=1, device="cuda").engine_kwargs
    assert (engine["max_num_seqs"], engine["enable_prefix_caching"]) == (1, True)
    assert engine["max_model_len"] == 1024  # the preset's 32768 given way
    plain = llm_config(ServerSpec(model="Qwen2.5-72B-Instruct"), 1, "cuda").engine_kwargs
    assert "max_num_seqs" not in plain and plain["max_model_len"] == 32768
    refused = {"--port": "not a vLLM engine flag", "--max-num-seqs": "invalid int value"}
    for flag, said in refused.items():
        bad = [flag, "x"]
        with pytest.raises(ServerStartError, match=said):
            llm_config(ServerSpec(model="Qwen2.5-72B-Instruct", extra_args=bad), 1, "cuda")


def test_named_adapter_presets():
    from groundcover.serving.launch.registry import ADAPTER_PRESETS, lora_adapter

    claims = ADAPTER_PRESETS["icat-claims"]
    assert (claims.base, claims.rank) == ("Llama-3.1-8B-Instruct", 64)  # ICAT: r=64
    served = lora_adapter("icat-claims", "/adapters/claims", "Llama-3.1-8B-Instruct")
    assert (served.path, served.rank) == ("/adapters/claims", 64)


def test_free_ports_come_from_below_the_ephemeral_range_and_ignore_the_seed():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    draws = []
    for _ in range(3):
        random.seed(7)  # a seeded run in two processes must not draw the same ports
        draws.append(free_port())
    assert all(20000 <= port < low for port in draws)  # no outgoing connection takes these
    assert len(set(draws)) > 1
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", draws[0]))  # free when handed out


def test_a_chosen_port_moves_a_few_times_and_a_named_one_never(tmp_path):
    server = VLLMServer(ServerSpec(model="embedded"), tmp_path / "log")
    ports = [server.port]
    while server.move_port():
        ports.append(server.port)
    assert server.port_moves == 3
    assert all(a != b for a, b in zip(ports, ports[1:], strict=False))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        named = VLLMServer(ServerSpec(model="embedded", port=port), tmp_path / "log")
        assert not named.move_port()
        with pytest.raises(ServerStartError, match=f"port {port} on 127.0.0.1 is already in use"):
            named.launch()
    assert named.process is None  # refused before anything started
