"""Reasoning judges: a judge shaped like vLLM serving gpt-oss (reasoning before every answer,
cut at max_tokens) gives exactly the scores of a plain judge; a reply still cut at the largest
budget is its own status, never a score."""

from __future__ import annotations

import pytest

from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
from groundcover.pipelines.comprehensiveness.framework import evaluate_item
from groundcover.pipelines.comprehensiveness.nli_method import LlmNli
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, UserError
from groundcover.pipelines.runtime.contract.results import STATUSES, UNSCORED
from groundcover.pipelines.runtime.execution.identity import evaluator_identity
from groundcover.pipelines.runtime.execution.models import reasoning_of
from groundcover.serving.client import ChatResult, EvalClient, StageUsage, answer_tokens
from groundcover.serving.reasoning import BUDGETS, Reasoning, ReasoningCut
from tests.support.faults import cases
from tests.support.loopback import replay_judged
from tests.support.scripted import ScriptedClient, label
from tests.test_exact_scores import ITEM, NLI_SCRIPTS

ASK = [{"role": "user", "content": "Rate it."}]


def test_each_style_sends_its_setting_and_sizes_its_budget():
    gpt_oss = Reasoning.make("effort", "high")
    assert gpt_oss.params() == {"reasoning_effort": "high"}
    assert gpt_oss.budgets() == [BUDGETS["high"], 2 * BUDGETS["high"], 4 * BUDGETS["high"]]
    qwen_off = Reasoning.make("toggle", "off")
    assert qwen_off.params() == {"chat_template_kwargs": {"enable_thinking": False}}
    assert qwen_off.budgets() == [0] and not qwen_off.on
    assert Reasoning.make("toggle", "low", 300).budgets() == [300, 600, 1200]
    assert Reasoning.make("always", "medium").params() == {}
    with pytest.raises(ValueError, match="cannot turn reasoning off"):
        Reasoning.make("effort", "off")
    with pytest.raises(ValueError, match="cannot turn reasoning off"):
        Reasoning.make("always", "off")


def test_presets_and_options_decide_how_a_role_reasons():
    assert reasoning_of(EvaluatorConfig(model="gpt-oss-20b", endpoint="http://h:1/v1")) == (
        Reasoning("effort", "medium", BUDGETS["medium"])
    )
    qwen = EvaluatorConfig(model="Qwen3-8B", endpoint="http://h:1/v1", reasoning="off")
    assert reasoning_of(qwen) == Reasoning("toggle", "off", 0)
    plain = EvaluatorConfig(model="Llama-3.1-8B-Instruct", endpoint="http://h:1/v1")
    assert reasoning_of(plain) is None
    told = plain.model_copy(update={"reasoning": "low", "reasoning_tokens": 700})
    assert reasoning_of(told) == Reasoning("always", "low", 700)
    with pytest.raises(UserError, match="cannot turn reasoning off"):
        reasoning_of(
            EvaluatorConfig(model="gpt-oss-20b", endpoint="http://h:1/v1", reasoning="off")
        )
    # the effort is part of a run's identity only when set; the token budget never is
    assert "reasoning" not in evaluator_identity(plain)
    assert evaluator_identity(told)["reasoning"] == "low"
    assert "reasoning_tokens" not in evaluator_identity(told)


async def test_a_known_reasoning_model_gets_its_budget_on_top_of_the_answers():
    reasoning = Reasoning.make("effort", "medium")
    async with ScriptedClient({"rate": "4"}, reasons=300, reasoning=reasoning) as client:
        result = await client.chat(ASK, stage="rate", max_tokens=8)
    assert result.text == "4" and result.reasoning.startswith("hmm")
    [call] = client.calls
    assert call.body["max_tokens"] == 8 + BUDGETS["medium"]
    assert call.body["reasoning_effort"] == "medium"
    assert client.notices == []


async def test_a_model_found_to_reason_is_asked_again_with_a_budget_and_said_once(capsys):
    async with ScriptedClient({"rate": "4"}, reasons=300) as client:
        first = await client.chat(ASK, stage="rate", max_tokens=8)
        second = await client.chat(ASK, stage="rate", max_tokens=8)
    assert first.text == second.text == "4"
    budgets = [c.body["max_tokens"] for c in client.calls]
    assert budgets == [8, 8 + BUDGETS["medium"], 8 + BUDGETS["medium"]]  # one retry, then known
    assert len(client.notices) == 1 and capsys.readouterr().err.count("reasons before") == 1


async def test_a_reply_still_cut_at_the_largest_budget_raises_reasoning_cut():
    reasoning = Reasoning.make("toggle", "low", 100)
    async with ScriptedClient({"rate": "4"}, reasons=10_000, reasoning=reasoning) as client:
        with pytest.raises(ReasoningCut) as cut:
            await client.chat(ASK, stage="rate", max_tokens=8)
    assert [c.body["max_tokens"] for c in client.calls] == [108, 208, 408]
    assert cut.value.stage == "rate" and cut.value.max_tokens == 408


def test_label_logprobs_skip_the_reasoning_tokens_some_servers_list():
    reply = label({"3": 0.25, "4": 0.75})
    reasoning_tokens = [{"token": "hmm ", "logprob": -0.1}] * 5
    raw = {
        "choices": [
            {
                "message": {"content": "4", "reasoning": "hmm " * 5},
                "finish_reason": "stop",
                "logprobs": {"content": reasoning_tokens + reply.logprobs},
            }
        ]
    }
    result = ChatResult("4", "stop", 0, 0, False, raw)
    assert result.token_logprobs == reply.logprobs
    assert answer_tokens(reasoning_tokens, "4") == []  # no suffix spells it: none, not garbage
    # a label's own probability: its tokens' only, never the reasoning's (0.75, not 0.75 * e^-0.5)
    assert result.label_probability("4") == pytest.approx(0.75)
    assert result.label_probability("3") is None  # the answer does not end in it


def test_a_label_after_written_reasoning_has_its_own_tokens_probability():
    """'Because ... \nB': the letter's token alone (0.6), the two-token label 'yes no' both
    (0.5 * 0.8); no logprobs at all: None."""
    import math

    tokens = [
        {"token": "Because it says so.", "logprob": -2.0},
        {"token": "\n", "logprob": -0.1},
        {"token": "B", "logprob": math.log(0.6)},
    ]
    raw = {"choices": [{"message": {"content": "x"}, "logprobs": {"content": tokens}}]}
    assert ChatResult("x", "stop", 0, 0, False, raw).label_probability("B") == pytest.approx(0.6)
    two = [{"token": "yes", "logprob": math.log(0.5)}, {"token": " no", "logprob": math.log(0.8)}]
    raw = {"choices": [{"message": {"content": "yes no"}, "logprobs": {"content": two}}]}
    assert ChatResult("yes no", "stop", 0, 0, False, raw).label_probability("yes no") == (
        pytest.approx(0.4)
    )
    bare = {"choices": [{"message": {"content": "B"}}]}
    assert ChatResult("B", "stop", 0, 0, False, bare).label_probability("B") is None


@pytest.mark.parametrize("reasoned", [False, True], ids=["answer", "reasoning-listed-too"])
def test_the_end_of_turn_a_server_lists_after_the_label_is_not_the_labels(reasoned):
    """vLLM lists ``<|im_end|>`` (the token generation stopped on) after the answer's tokens:
    the label's probability is its own tokens' (0.5 * 0.8), the sequence's their mean, as
    without it; a list that cannot be lined up with the text is kept whole."""
    import math

    thought = [{"token": "hmm </think>", "logprob": -0.3}] if reasoned else []
    tokens = [
        {"token": "yes", "logprob": math.log(0.5)},
        {"token": " no", "logprob": math.log(0.8)},
        {"token": "<|im_end|>", "logprob": 0.0},
    ]
    message = {"content": "yes no", "reasoning": "hmm" if reasoned else None}
    raw = {"choices": [{"message": message, "logprobs": {"content": thought + tokens}}]}
    result = ChatResult("yes no", "stop", 0, 0, False, raw)
    assert result.token_logprobs == tokens[:2]
    assert result.label_probability("yes no") == pytest.approx(0.4)
    assert result.sequence_probability == pytest.approx(math.sqrt(0.4))
    other = {"choices": [{"message": {"content": "B"}, "logprobs": {"content": tokens}}]}
    assert ChatResult("B", "stop", 0, 0, False, other).token_logprobs == tokens


@pytest.mark.parametrize(
    "listed", [False, True], ids=["logprobs-answer-only", "logprobs-with-reasoning"]
)
async def test_nli_method_scores_equal_a_plain_judge_with_a_reasoning_judge(tmp_path, listed):
    """Every stage of the NLI method (extraction, revision, logprob-weighted relevance, NLI
    labels) with 300 reasoning tokens before each answer: the same score and details as
    tests/test_exact_scores.py's plain judge, no unreadable or cut output, one retry only for
    the first request (the model is found to reason)."""
    options = ComprehensivenessOptions(protocol="spec", method="nli")
    async with ScriptedClient(NLI_SCRIPTS) as plain:
        expected = await evaluate_item(
            plain, ITEM, options, nli_judge=LlmNli(), run_dir=tmp_path / "a"
        )
    async with ScriptedClient(NLI_SCRIPTS, reasons=300, logprobs_with_reasoning=listed) as judge:
        got = await evaluate_item(judge, ITEM, options, nli_judge=LlmNli(), run_dir=tmp_path / "b")
    assert got.status == expected.status == "ok"
    assert got.score == expected.score == 0.5
    assert got.details["relevance"] == expected.details["relevance"]
    assert got.details["covered"] == expected.details["covered"]
    # reasoning tokens are counted apart, as part of the completion tokens
    nli = got.usage["nli"]
    assert nli["reasoning_tokens"] == 300 * nli["calls"]
    assert (
        nli["completion_tokens"] == expected.usage["nli"]["completion_tokens"] + 300 * nli["calls"]
    )
    assert expected.usage["nli"]["reasoning_tokens"] == 0
    asked = sum(1 for c in judge.calls if c.output)
    assert asked == len(plain.calls)  # every stage answered once
    assert len(judge.calls) - asked <= 1  # at most the one cut before the model was known


async def test_an_item_cut_in_reasoning_is_its_own_status_never_a_score(tmp_path):
    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from groundcover.pipelines.runtime.contract.context import ItemContext
    from groundcover.pipelines.runtime.execution.solve import solve_item

    assert "cut_in_reasoning" in STATUSES and "cut_in_reasoning" in UNSCORED
    options = ComprehensivenessOptions(protocol="spec", method="nli")
    reasoning = Reasoning.make("always", "low", 50)
    async with ScriptedClient(NLI_SCRIPTS, reasons=100_000, reasoning=reasoning) as judge:
        ctx = ItemContext(ITEM.id, judge, options, LlmNli(), tmp_path, 2, COMPREHENSIVENESS)
        result = await solve_item(COMPREHENSIVENESS, ITEM, ctx)
    assert result.status == "cut_in_reasoning" and result.score is None
    assert result.failure is not None and "reasoning used all" in result.failure.error


def test_a_resume_asks_items_cut_in_reasoning_again(tmp_path):
    """A cut item is final for its score (none) but not for the run: a rerun, e.g. with a
    larger --reasoning-tokens, asks it again; its new record supersedes the cut one."""
    from tests.test_runstore import failed, ok, open_store

    store = open_store(tmp_path / "run")
    store.append(failed("a", "cut_in_reasoning"))
    store.append(ok("b"))
    store.close()
    again = open_store(tmp_path / "run")
    assert again.pending(["a", "b"]) == {"a"}
    again.append(ok("a", 0.5))
    again.close()
    records = {r.id: r for r in open_store(tmp_path / "run").results()}
    assert records["a"].status == "ok" and records["a"].score == 0.5


def _timeless(value):
    """Without wall times (``seconds``), which differ between any two runs."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def _scores(outcomes) -> dict:
    return {
        key: (
            [(r.id, r.status, r.score, _timeless(r.details)) for r in outcome.results],
            _timeless(outcome.tables),
        )
        for key, outcome in outcomes.items()
    }


CASES = [c.name for c in cases()]


@pytest.mark.parametrize("parser", ["reasoning", "reasoning_content", None])
@pytest.mark.parametrize("case", CASES)
def test_every_framework_scores_the_same_with_a_judge_that_reasons(tmp_path, case, parser):
    """Each framework's replay case (comprehensiveness x 6, ICAT, GaRAGe, FanOutQA, CRUX,
    teacher data) against a loopback server shaped like vLLM serving gpt-oss: 300 reasoning
    tokens before each answer, cut at max_tokens, the reasoning's tokens listed in the
    logprobs; returned apart (under either field name) or, with no reasoning parser, inside the
    content. The records (status, score, details) and tables equal a plain judge's, no item is
    cut, and the only extra requests are those sent before the first reply showed the model
    reasons."""
    found = next(c for c in cases() if c.name == case)
    plain, plain_judge = replay_judged(found, 0, tmp_path / "plain")
    reasoned, judge = replay_judged(found, 300, tmp_path / "reasoned", parser)
    assert _scores(reasoned) == _scores(plain)
    statuses = [r.status for o in reasoned.values() for r in o.results]
    assert "cut_in_reasoning" not in statuses
    # the only extra requests are those cut before the client knew the model reasons: sent
    # side by side before the first reply came back, each asked again once
    cut = [c for c in judge.calls if (c.body.get("max_tokens") or 301) <= 300]
    assert len(judge.calls) - len(plain_judge.calls) == len(cut) <= judge.client.peak_in_flight
    # constrained decoding only where the server parses the reasoning apart (found from the
    # first reply: the last requests show what was learned)
    assert judge.client.reasoning_parser is (parser is not None)
    if parser is None:
        assert "extra_body" not in judge.calls[-1].body
    elif any("extra_body" in c.body for c in plain_judge.calls):
        assert any("extra_body" in c.body for c in judge.calls)


def test_reproduce_comprehensiveness_runs_each_evaluator_as_the_papers_appendix(tmp_path):
    """Paper protocol: gpt-oss at effort medium without the units tool, Llama and Qwen with
    it; the spec protocol keeps the options as given."""
    import json

    from groundcover.pipelines.comprehensiveness.reproduce import REPRODUCE, ReproduceOptions
    from groundcover.pipelines.runtime.contract.config import RunConfig
    from groundcover.pipelines.runtime.contract.protocol import RunRequest
    from tests.test_runtime import WC_ROW

    data = tmp_path / "wc.jsonl"
    data.write_text(json.dumps(WC_ROW) + "\n")
    url = "http://127.0.0.1:9/v1"

    def cells(protocol: str) -> dict[str, tuple[str | None, bool]]:
        options = ReproduceOptions(
            models=[f"gpt-oss-20b@{url}", f"Qwen2.5-72B-Instruct@{url}", f"small@{url}"],
            methods=["qa"],
            wikicontradict=data,
            metric=ComprehensivenessOptions(protocol=protocol),
        )
        request = RunRequest(EvaluatorConfig(model="x", endpoint=url), RunConfig(), options)
        plans = REPRODUCE.plan(request, tmp_path)
        return {p.key: (p.roles["judge"].reasoning, p.options.tools) for p in plans}

    assert cells("paper") == {
        "gpt-oss-20b/qa/wikicontradict": ("medium", False),
        "Qwen2.5-72B-Instruct/qa/wikicontradict": (None, True),
        "small/qa/wikicontradict": (None, False),
    }
    assert set(cells("spec").values()) == {(None, False)}


@pytest.mark.parametrize(
    ("content", "reported", "expected"),
    [
        ("", 0, 40),  # cut in its reasoning: every completion token was reasoning
        ("abcd", 0, 32),  # 16 of 20 characters were reasoning: 0.8 * 40
        ("abcd", 25, 25),  # the server's own count wins
    ],
)
def test_reasoning_tokens_are_the_servers_count_else_counted_here(content, reported, expected):
    raw = {
        "choices": [{"message": {"content": content, "reasoning": "x" * 16}}],
        "usage": {
            "completion_tokens": 40,
            "completion_tokens_details": {"reasoning_tokens": reported},
        },
    }
    assert ChatResult(content, "stop", 0, 40, False, raw).reasoning_tokens == expected


@pytest.mark.parametrize(
    ("content", "reasoning", "answer"),
    [
        ("<think>weigh it</think>\n\n4", "weigh it", "4"),
        ("weigh it</think>4", "weigh it", "4"),  # R1 templates open the answer with <think>
        ("<think>weigh it, then", "weigh it, then", ""),  # cut before its answer
        ("4", "", "4"),
    ],
)
def test_a_server_without_a_reasoning_parser_leaves_it_in_the_content(content, reasoning, answer):
    from groundcover.serving.reasoning import split_inline

    assert split_inline(content) == (reasoning, answer)
    finish = "length" if not answer else "stop"
    raw = {"choices": [{"message": {"content": content}, "finish_reason": finish}]}
    result = EvalClient._result(raw, False, StageUsage())
    assert (result.text, result.reasoning) == (answer, reasoning)
    assert result.cut_in_reasoning is (not answer)


def test_constrained_decoding_only_where_the_server_parses_the_reasoning_apart():
    from groundcover.pipelines.runtime.execution.models import started_with_reasoning_parser

    medium = Reasoning.make("effort", "medium")
    assert EvalClient("http://127.0.0.1:9/v1", "plain").constrains
    assert not EvalClient("http://127.0.0.1:9/v1", "oss", reasoning=medium).constrains
    assert EvalClient(
        "http://127.0.0.1:9/v1", "oss", reasoning=medium, reasoning_parser=True
    ).constrains
    off = Reasoning.make("toggle", "off")
    assert EvalClient("http://127.0.0.1:9/v1", "qwen", reasoning=off).constrains
    # the project starts a reasoning preset with its parser; an endpoint is found out
    assert started_with_reasoning_parser(EvaluatorConfig(model="gpt-oss-20b")) is True
    endpoint = EvaluatorConfig(model="gpt-oss-20b", endpoint="http://127.0.0.1:9/v1")
    assert started_with_reasoning_parser(endpoint) is None
    assert started_with_reasoning_parser(EvaluatorConfig(model="Llama-3.1-8B-Instruct")) is None


async def test_a_reasoning_models_choice_is_constrained_once_its_parser_is_seen():
    reasoning = Reasoning.make("effort", "low", 100)
    async with ScriptedClient({"pick": ["B", "B"]}, reasons=30, reasoning=reasoning) as client:
        first = await client.choice(ASK, ["A", "B"], stage="pick")
        second = await client.choice(ASK, ["A", "B"], stage="pick")
    assert first.value == second.value == "B"
    assert [("extra_body" in c.body) for c in client.calls] == [False, True]
    assert client.reasoning_parser is True


async def test_keep_reasoning_keeps_each_requests_reasoning_in_the_record(tmp_path):
    import json

    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from groundcover.pipelines.runtime.contract.context import ItemContext
    from groundcover.pipelines.runtime.execution.solve import solve_item

    options = ComprehensivenessOptions(protocol="spec", method="nli")
    reasoning = Reasoning.make("effort", "low", 100)
    records = {}
    for keep in (False, True):
        async with ScriptedClient(NLI_SCRIPTS, reasons=30, reasoning=reasoning) as judge:
            ctx = ItemContext(ITEM.id, judge, options, LlmNli(), tmp_path, 2, COMPREHENSIVENESS)
            ctx.reasoning_log = [] if keep else None
            record = await solve_item(COMPREHENSIVENESS, ITEM, ctx)
            records[keep] = json.loads(record.model_dump_json())
    assert "reasoning" not in records[False]  # the record is as before: nothing added
    kept = records[True].pop("reasoning")
    assert records[True] == records[False]
    assert len(kept) == len(judge.calls)  # one entry per request, each with its stage
    assert {k["stage"] for k in kept} == {c.stage for c in judge.calls}
    assert all(k["tokens"] == 30 and k["reasoning"].startswith("hmm") for k in kept)


def test_keep_reasoning_is_a_run_option_of_every_command():
    from groundcover.pipelines.cli.options import Shared

    assert Shared(keep_reasoning=True).overrides()["run.keep_reasoning"] is True
    assert Shared().overrides()["run.keep_reasoning"] is None  # not given: YAML or default
