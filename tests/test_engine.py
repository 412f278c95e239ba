"""The evaluator client against the real vLLM server (CPU build) serving a tiny Llama + LoRA."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from groundcover.serving.cache import ResponseCache
from groundcover.serving.client import EvalClient, Tool
from tests.conftest import ADAPTER

pytestmark = pytest.mark.engine


def make_client(server, cache=None, **kwargs) -> EvalClient:
    params = {"temperature": 0.0, "max_tokens": 12}
    return EvalClient(
        server.base_url, server.served_name, cache=cache, default_params=params, **kwargs
    )


def prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"question number {i} about the river"}] for i in range(n)]


async def test_concurrent_requests_are_bounded_and_all_answered(vllm_server):
    async with make_client(vllm_server, concurrency=8) as client:
        results = await asyncio.gather(*(client.chat(m, stage="s") for m in prompts(48)))
    assert len(results) == 48
    assert all(r.completion_tokens > 0 for r in results)
    assert client.peak_in_flight == 8  # really concurrent, never above the bound
    usage = client.usage["s"]
    assert (usage.requests, usage.calls, usage.cache_hits) == (48, 48, 0)
    assert usage.prompt_tokens == sum(r.prompt_tokens for r in results)


async def test_rerun_is_served_from_cache_with_zero_requests(vllm_server, tmp_path):
    cache_path = tmp_path / "cache.sqlite"
    async with make_client(vllm_server, cache=ResponseCache(cache_path)) as client:
        first = await asyncio.gather(*(client.chat(m, template="t@v1") for m in prompts(10)))
    # A new process would open the same file: a new cache object and a new client.
    async with make_client(vllm_server, cache=ResponseCache(cache_path)) as client:
        second = await asyncio.gather(*(client.chat(m, template="t@v1") for m in prompts(10)))
        usage = client.usage["default"]
        assert (usage.requests, usage.cache_hits) == (0, 10)
        assert [r.text for r in first] == [r.text for r in second]
        assert all(r.cached for r in second)
        # A new prompt-template version is a different request.
        await client.chat(prompts(1)[0], template="t@v2")
        assert usage.requests == 1


async def test_base_model_and_adapter_answer_differently(vllm_server):
    async with make_client(vllm_server, max_retries=0) as client:
        messages = prompts(4)
        base = [await client.chat(m, max_tokens=16) for m in messages]
        tuned = [await client.chat(m, adapter=ADAPTER, max_tokens=16) for m in messages]
    assert [b.text for b in base] != [t.text for t in tuned]
    assert sum(b.text != t.text for b, t in zip(base, tuned, strict=True)) >= 3


async def test_label_score_is_a_weighted_value_in_range(vllm_server):
    async with make_client(vllm_server) as client:
        scored = await client.label_score(
            [{"role": "user", "content": "Rate relevance from 1 to 5."}], stage="relevance"
        )
    assert scored.status == "ok"
    assert 1.0 <= scored.score <= 5.0
    assert set(scored.distribution) <= {"1", "2", "3", "4", "5"}
    assert sum(scored.distribution.values()) == pytest.approx(1.0)
    expected = sum(float(k) * p for k, p in scored.distribution.items())
    assert scored.score == pytest.approx(expected)
    # A random model spreads its mass: the score is weighted, not just the argmax label.
    assert len(scored.distribution) > 1


class Verdict(BaseModel):
    answer: Literal["yes", "no", "unknown"]
    confidence: Literal[1, 2, 3, 4, 5]


async def test_structured_output_parses_into_the_schema(vllm_server):
    async with make_client(vllm_server) as client:
        parsed = await client.structured(prompts(1)[0], Verdict, max_tokens=40)
        choice = await client.choice(prompts(1)[0], ["entailment", "contradiction", "neutral"])
    assert parsed.status == "ok", parsed.error
    assert isinstance(parsed.value, Verdict)
    assert choice.status == "ok"
    assert choice.value in {"entailment", "contradiction", "neutral"}


async def test_a_chosen_labels_probability_is_its_own_tokens_not_the_end_of_turn(vllm_server):
    """vLLM lists the token generation stopped on after the label's own: the label's probability
    (what ``--confidence logprobs`` and a cascade tier record) is over the tokens that spell it,
    never None for want of a suffix spelling it, nor the end of turn's."""
    async with make_client(vllm_server) as client:
        parsed = await client.choice(
            prompts(1)[0], ["entailment", "contradiction", "neutral"], logprobs=True
        )
    assert parsed.ok and parsed.result is not None
    listed = parsed.result.raw["choices"][0]["logprobs"]["content"]
    own = parsed.result.token_logprobs
    assert len(listed) > len(own)  # the server listed the end of turn as well
    assert "".join(t["token"] for t in own).strip() == parsed.value
    probability = parsed.result.label_probability(parsed.value)
    assert probability == pytest.approx(math.exp(sum(t["logprob"] for t in own)))
    assert 0.0 < probability <= 1.0
    assert parsed.result.sequence_probability == pytest.approx(probability ** (1 / len(own)))


async def test_unconstrained_garbage_is_reasked_then_recorded_unparseable(vllm_server):
    # Without constrained decoding a random model cannot produce the JSON: every attempt is kept
    # and the result says so, instead of a default value.
    async with make_client(vllm_server) as client:
        parsed = await client.structured(
            prompts(1)[0], Verdict, constrained=False, max_reasks=2, stage="x"
        )
    assert parsed.status == "unparseable"
    assert parsed.value is None
    assert len(parsed.outputs) == 3
    assert client.usage["x"].calls == 3


class Quantities(BaseModel):
    a: str = Field(max_length=8)  # bounded, so constrained arguments fit in max_tokens
    b: str = Field(max_length=8)


async def test_tool_call_loop_executes_validated_arguments(vllm_server):
    seen: list[Quantities] = []

    def compare(args: Quantities) -> dict:
        seen.append(args)
        return {"same": args.a == args.b}

    tool = Tool("compare", "Compare two quantities.", Quantities, compare)
    async with make_client(vllm_server) as client:
        run = await client.run_tools(
            prompts(1)[0],
            [tool],
            tool_choice={"type": "function", "function": {"name": "compare"}},
            followup_tool_choice="none",
            max_tokens=64,
        )
    assert len(run.calls) >= 1 and len(seen) == len(run.calls)
    assert run.calls[0]["name"] == "compare"
    assert '"same"' in run.calls[0]["result"]
    roles = [m["role"] for m in run.messages]
    assert roles[-2:] == ["assistant", "tool"]


def test_tool_never_evaluates_bad_arguments():
    calls = []
    tool = Tool("compare", "c", Quantities, lambda a: calls.append(a) or {"ok": True})
    assert "JSONDecodeError" in tool.call('{"a": "1 m", "b": ')  # truncated
    assert "ValidationError" in tool.call('{"a": "__import__(\'os\')"}')  # missing b, too long
    assert "ValidationError" in tool.call("true")
    assert calls == []
    assert tool.call({"a": "1 m", "b": "100 cm"}) == '{"ok": true}'


async def test_timeouts_are_retried_then_reported(vllm_server):
    from groundcover.serving.client import EndpointError

    client = make_client(vllm_server, timeout=0.001, max_retries=2, backoff=0.01)
    with pytest.raises(EndpointError, match="gave up after 3 attempts"):
        await client.chat(prompts(1)[0], stage="t", max_tokens=200)
    await client.aclose()
    usage = client.usage["t"]
    assert (usage.retries, usage.failures, usage.requests, usage.calls) == (2, 1, 0, 0)


async def test_bad_request_fails_at_once_with_the_server_message(vllm_server):
    from groundcover.serving.client import EndpointError

    async with make_client(vllm_server, max_retries=5) as client:
        with pytest.raises(EndpointError, match="404|does not exist"):
            await client.chat(prompts(1)[0], adapter="no-such-adapter", stage="t")
        assert client.usage["t"].retries == 0


def test_adapter_reaches_the_server_through_every_command(vllm_server, tmp_path):
    # --adapter (or MODEL:ADAPTER) must send every request of a run to the LoRA adapter: the
    # answers equal what the adapter gives directly and differ from the base model's.
    import json

    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app

    questions = tmp_path / "q.jsonl"
    texts = [f"question number {i} about the river" for i in range(4)]
    questions.write_text(
        "".join(json.dumps({"id": str(i), "question": t}) + "\n" for i, t in enumerate(texts))
    )

    def generate(run: str, *model_args: str) -> dict[str, str]:
        args = [
            "generate",
            str(questions),
            "--endpoint",
            vllm_server.base_url,
            *model_args,
            "--max-tokens",
            "16",
            "--run-dir",
            str(tmp_path / run),
            "--quiet",
            "--no-cache",
        ]
        result = CliRunner().invoke(app, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        lines = (tmp_path / run / "results.jsonl").read_text().splitlines()
        return {r["id"]: r["details"]["response"] for r in map(json.loads, lines)}

    name = vllm_server.served_name
    base = generate("base", "--model", name)
    tuned = generate("tuned", "--model", name, "--adapter", ADAPTER)
    assert generate("addressed", "--model", f"{name}:{ADAPTER}") == tuned
    assert sum(base[k] != tuned[k] for k in base) >= 3
    manifest = json.loads((tmp_path / "tuned" / "manifest.json").read_text())
    assert manifest["config"]["adapter"] == ADAPTER

    async def direct() -> list[str]:
        from groundcover.pipelines.shared.answering import PROMPTS

        async with make_client(vllm_server, adapter=ADAPTER) as client:
            out = []
            for text in texts:
                messages = PROMPTS["answer"].messages(question=text, query=text, contexts=[])
                out.append((await client.chat(messages, max_tokens=16)).text.strip())
            return out

    assert [tuned[str(i)] for i in range(4)] == asyncio.run(direct())
    missing = CliRunner().invoke(
        app,
        [
            "generate",
            str(questions),
            "--endpoint",
            vllm_server.base_url,
            "--model",
            name,
            "--adapter",
            "nope",
            "--run-dir",
            str(tmp_path / "x"),
            "--quiet",
        ],
    )
    assert missing.exit_code == 2
    assert "adapter 'nope' is not served at" in missing.output


def test_the_cpu_servers_engine_core_is_forked_not_spawned(vllm_server):
    """A spawned engine core imports torch and vLLM again; ours is forked (``engine_main``). A
    process made by exec gets a fresh, randomised address space; a forked one keeps its parent's
    layout, so its heap starts where the server's does."""
    import psutil

    if vllm_server.device != "cpu":
        pytest.skip("the fork is for vLLM's CPU platform")
    if Path("/proc/sys/kernel/randomize_va_space").read_text().strip() == "0":
        pytest.skip("address-space randomisation is off here: exec and fork look alike")
    server = psutil.Process(vllm_server.process.pid)
    assert "groundcover.serving.launch.engine_main" in server.cmdline()
    (engine,) = [p for p in server.children() if "EngineCore" in " ".join(p.cmdline())]
    assert heap_start(engine.pid) == heap_start(server.pid)


def heap_start(pid: int) -> str:
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return next(line.split("-")[0] for line in maps if line.endswith("[heap]"))
