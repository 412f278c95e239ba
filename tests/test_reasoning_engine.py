"""A real vLLM server (CPU build) with vLLM's deepseek_r1 reasoning parser, serving a tiny random
model whose template opens every answer with <think> (a reasoning model's shape): the reasoning
arrives apart from the content as the client expects, and a reply cut in its reasoning is asked
again with larger budgets, then raised as ReasoningCut with its reasoning tokens counted."""

from __future__ import annotations

import httpx
import pytest

from groundcover.serving.client import EvalClient
from groundcover.serving.launch.server import ServerSpec, VLLMServer
from groundcover.serving.reasoning import Reasoning, ReasoningCut
from tests.conftest import TEST_SERVER_ENV, require_engine

pytestmark = pytest.mark.engine
ASK = [{"role": "user", "content": "Rate the river from 1 to 5."}]
# random weights may end their turn early; ignore_eos keeps them reasoning to max_tokens
KEEP_GOING = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def reasoner(tmp_path_factory):
    # own server: vLLM's reasoning parser is a server flag, and it would turn every reply of the
    # session's shared server (whose model has no <think>) into reasoning
    from tests.support.tiny import build_tiny_llama

    require_engine()
    model = build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-reasoner", reasoning=True)
    spec = ServerSpec(
        model=str(model), extra_args=["--reasoning-parser", "deepseek_r1"], env=TEST_SERVER_ENV
    )
    with VLLMServer(spec, tmp_path_factory.mktemp("logs") / "reasoner.log") as server:
        yield server


def test_the_reasoning_arrives_apart_from_the_content(reasoner):
    body = {"model": reasoner.served_name, "messages": ASK, "max_tokens": 6, **KEEP_GOING}
    reply = httpx.post(f"{reasoner.base_url}/chat/completions", json=body, timeout=120).json()
    message = reply["choices"][0]["message"]
    thought = message.get("reasoning") or message.get("reasoning_content")
    assert thought and not message.get("content")
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 6
    # vLLM counts reasoning tokens only between <think> and </think> in the output: this
    # template (as R1 distills') opens with <think> in the prompt, so it reports none; the
    # client counts them itself (ChatResult.reasoning_tokens)
    assert reply["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


async def test_a_reply_cut_in_its_reasoning_is_asked_again_then_raised(reasoner):
    reasoning = Reasoning.make("always", "low", 16)
    async with EvalClient(
        reasoner.base_url,
        reasoner.served_name,
        reasoning=reasoning,
        default_params=KEEP_GOING,
        max_retries=0,
    ) as client:
        with pytest.raises(ReasoningCut) as cut:
            await client.chat(ASK, stage="rate", max_tokens=6)
    assert cut.value.max_tokens == 6 + 64  # the third try: budgets 16, 32, 64
    usage = client.usage["rate"]
    assert usage.requests == 3 and usage.calls == 3
    assert usage.reasoning_tokens == usage.completion_tokens == (6 + 16) + (6 + 32) + (6 + 64)


async def test_a_model_that_is_no_preset_is_found_to_reason(reasoner):
    """Without --reasoning the client does not know this model reasons; its first reply says
    so. The retry then carries the detected budget (checked on the request, not run: a random
    model would reason through all of it)."""
    sent: list[int] = []

    class Watching(EvalClient):
        async def _one(self, messages, body, stage, template, adapter, meter):
            sent.append(body["max_tokens"])
            if len(sent) > 1:  # the retry: what it asks is the point, not a long generation
                raise RuntimeError("stop here")
            return await super()._one(messages, body, stage, template, adapter, meter)

    async with Watching(
        reasoner.base_url, reasoner.served_name, default_params=KEEP_GOING, max_retries=0
    ) as client:
        with pytest.raises(RuntimeError, match="stop here"):
            await client.chat(ASK, stage="rate", max_tokens=6)
    assert client.reasoning == Reasoning.detected()
    assert sent == [6, 6 + client.reasoning.budget]
    assert len(client.notices) == 1
