"""The evaluator client every pipeline uses.

Async and OpenAI-compatible (vLLM, SGLang, TGI or OpenAI by URL), with bounded concurrency,
retries with backoff, a persistent response cache, token accounting per pipeline stage, structured
output with a bounded re-ask, tool calling, and logprob-weighted label scores.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from .batch import AskOnline, Batcher, BatchError, LineFailed
from .cache import ResponseCache, cache_key
from .credentials import take_credentials
from .limits import AdaptiveLimit, FixedLimit
from .parsing import ParseError, extract_json, match_choice
from .reasoning import Reasoning, ReasoningCut, reasoning_text, split_inline
from .redact import clipped
from .templates import REASK
from .transport import (
    ConnectionFault,
    HttpTransport,
    StatusError,
    TransportError,
)

T = TypeVar("T", bound=BaseModel)
Status = Literal["ok", "unparseable"]

# The longest Retry-After a client waits for before its next try.
MAX_RETRY_AFTER = 300.0


class EndpointError(RuntimeError):
    """The endpoint kept failing after every retry, or refuses every request (auth, unknown
    model): a run cannot go on, but what it finished is kept and a rerun resumes."""


class RequestRejected(EndpointError):
    """The server refused this one request as malformed (400 / 413 / 422, e.g. a prompt longer
    than the context window): the item it belongs to fails, the run goes on."""

    def __init__(self, message: str, stage: str = "request"):
        super().__init__(message)
        self.stage = stage


ITEM_LEVEL_STATUS = (400, 413, 422)
GIVE_UP_RUN = 8  # calls given up in a row (no success between) that mean the endpoint is down


@dataclass
class StageUsage:
    calls: int = 0  # answers handed to the pipeline (cached or not)
    requests: int = 0  # HTTP requests that reached the endpoint successfully
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0
    prompt_tokens: int = 0  # over all calls, cached included: the logical cost of the stage
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens, spent reasoning (where the server says)
    seconds: float = 0.0  # wall time spent in requests
    backoff_seconds: float = 0.0  # waited between a failed attempt and its retry
    # of prompt and completion tokens, those of a batch role's calls bought online after their
    # batch line failed (``--batch-retry online``): priced online, not at the batch price
    online_prompt_tokens: int = 0
    online_completion_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def add(self, other: StageUsage, fields: tuple[str, ...] | None = None) -> None:
        for name in fields or tuple(self.__dict__):
            setattr(self, name, getattr(self, name) + getattr(other, name))


# what a request's attempts add to an item's usage (its wall time stays the stage's alone:
# records of equal runs stay equal)
ATTEMPT_FIELDS = (
    "requests",
    "retries",
    "failures",
    "backoff_seconds",
    "online_prompt_tokens",
    "online_completion_tokens",
)


@dataclass
class ChatResult:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached: bool
    raw: dict[str, Any]
    # reasoning a server without a reasoning parser left in the content (split off ``text``)
    inline_reasoning: str = ""

    @property
    def message(self) -> dict[str, Any]:
        return self.raw["choices"][0]["message"]

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []

    @property
    def reasoning(self) -> str:
        """What the model reasoned before its answer (kept apart: parsers read ``text``)."""
        return reasoning_text(self.message) or self.inline_reasoning

    @property
    def reasoning_tokens(self) -> int:
        """Of the completion tokens, those spent reasoning: as the server reports them (vLLM
        with a reasoning parser: ``usage.completion_tokens_details.reasoning_tokens``). vLLM
        counts only tokens between <think> and </think> in the output, so it says 0 for a
        template that opens the answer with <think> (R1 distills); for a reply with reasoning
        it then counts here: all completion tokens when there is no answer, else the reasoning's
        share of the characters (an estimate)."""
        details = (self.raw.get("usage") or {}).get("completion_tokens_details") or {}
        reported = int(details.get("reasoning_tokens") or 0)
        thought = self.reasoning
        if reported or not thought:
            return reported
        if not self.text:
            return self.completion_tokens
        return round(self.completion_tokens * len(thought) / (len(thought) + len(self.text)))

    @property
    def cut_in_reasoning(self) -> bool:
        """Cut at max_tokens before any answer: nothing to parse."""
        return self.finish_reason == "length" and not self.text.strip() and not self.tool_calls

    @property
    def token_logprobs(self) -> list[dict[str, Any]]:
        """Logprobs of the answer's tokens. Some servers also list the reasoning's tokens:
        those are cut off here; where the answer's tokens cannot be told apart, none are
        given (callers then use the sampled answer and say so)."""
        logprobs = self.raw["choices"][0].get("logprobs") or {}
        tokens = without_end_tokens(logprobs.get("content") or [], self.text)
        return answer_tokens(tokens, self.text) if tokens and self.reasoning else tokens

    @property
    def sequence_probability(self) -> float | None:
        """exp of the mean token log-probability of the output (None without logprobs): the
        probability of a short constrained answer such as a label."""
        values = [t["logprob"] for t in self.token_logprobs if t.get("logprob") is not None]
        return math.exp(sum(values) / len(values)) if values else None

    def label_probability(self, label: str) -> float | None:
        """The probability the model gave ``label`` where it ends the answer: the product of the
        probabilities of the trailing tokens that spell it, after any reasoning (None without
        logprobs, or where no trailing tokens spell the label)."""
        spelled = answer_tokens(self.token_logprobs, str(label))
        values = [t.get("logprob") for t in spelled]
        if not spelled or any(v is None for v in values):
            return None
        return math.exp(sum(float(v) for v in values if v is not None))


# the most tokens a server lists after the answer's text (an end of turn, an end of message)
END_TOKENS = 3


def without_end_tokens(tokens: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The tokens up to the end of the answer's text: vLLM lists the token generation stopped on
    (``<|im_end|>``, ``<|eot_id|>``, ``<|return|>``) with the answer's, though it spells none of
    the text; a label's probability is its own tokens' (SPEC: the label's tokens), never the
    end of turn's. Tokens that cannot be lined up with the text are kept as they are."""
    target = text.rstrip()
    if not target or not tokens:
        return tokens
    spelled = "".join(t.get("token", "") for t in tokens)
    for cut in range(len(tokens), max(len(tokens) - END_TOKENS, 0) - 1, -1):
        if spelled.rstrip().endswith(target):
            return tokens[:cut]
        if cut:
            spelled = spelled[: len(spelled) - len(tokens[cut - 1].get("token", ""))]
    return tokens


def answer_tokens(tokens: list[dict[str, Any]], answer: str) -> list[dict[str, Any]]:
    """The trailing tokens that spell ``answer`` (the whole list when it is the answer's own;
    none when no suffix spells it)."""
    target = answer.strip()
    spelled = ""
    for start in range(len(tokens) - 1, -1, -1):
        spelled = tokens[start].get("token", "") + spelled
        if target and spelled.strip() == target:
            return tokens[start:]
        if len(spelled.strip()) > len(target):
            break
    return []


@dataclass
class Parsed:
    """A parsed model answer, or the record of why it could not be parsed."""

    status: Status
    value: Any = None
    error: str | None = None
    outputs: list[str] = field(default_factory=list)  # every raw output, re-asks included
    result: ChatResult | None = None  # the answer that parsed (for its logprobs)
    # a judge panel's answer: the share of its members that gave it (``result`` is then None)
    probability: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class LabelScore:
    """Expected value of a label under the model's next-token distribution restricted to labels."""

    status: Status
    score: float | None = None
    distribution: dict[str, float] = field(default_factory=dict)
    label_mass: float = 0.0  # probability the model put on any label at that position
    output: str = ""
    error: str | None = None


def _integer(token: str) -> float | None:
    token = token.strip()
    return float(token) if token.isascii() and token.isdigit() else None


def label_score_from_logprobs(
    token_logprobs: Sequence[dict[str, Any]],
    labels: dict[str, float],
    *,
    any_integer: bool = False,
) -> LabelScore:
    """Weighted score at the first generated position whose token is a label.

    Tokens are compared stripped of whitespace, so " 3" and "3" count as the same label; the
    probabilities of the labels found among the top alternatives are renormalised over the labels.
    ``any_integer``: every integer token among the alternatives is a label worth its value (the
    comprehensiveness reference's weighting), not only those in ``labels``.
    """

    def value(token: str) -> float | None:
        token = token.strip()
        return labels.get(token, _integer(token) if any_integer else None)

    text = "".join(t.get("token", "") for t in token_logprobs)
    for position in token_logprobs:
        if value(position.get("token", "")) is None:
            continue
        probs: dict[str, float] = {}
        for alt in position.get("top_logprobs") or [position]:
            label = alt.get("token", "").strip()
            if value(label) is not None and alt.get("logprob") is not None:
                probs[label] = probs.get(label, 0.0) + math.exp(alt["logprob"])
        mass = sum(probs.values())
        distribution = {k: v / mass for k, v in probs.items()}
        score = sum((value(k) or 0.0) * p for k, p in distribution.items())  # labels only
        return LabelScore("ok", score, distribution, mass, text)
    return LabelScore("unparseable", output=text, error=f"no label of {list(labels)} in output")


def marker_label_scores(
    token_logprobs: Sequence[dict[str, Any]],
    marker: str,
    labels: dict[str, float],
    *,
    any_integer: bool = False,
) -> list[LabelScore]:
    """Weighted scores at every label token that follows ``<marker>:`` (e.g. "[Relevance: 4]")
    in a generated list, in order of appearance."""
    pattern = re.compile(rf"{re.escape(marker)}\s*:\s*$", re.IGNORECASE)
    scores, text = [], ""
    for i, position in enumerate(token_logprobs):
        token = position.get("token", "")
        if token.strip() in labels and pattern.search(
            text + token[: len(token) - len(token.lstrip())]
        ):
            window = token_logprobs[i : i + 1]
            scores.append(label_score_from_logprobs(window, labels, any_integer=any_integer))
        text += token
    return scores


@dataclass
class Tool:
    """A function the model may call; arguments are validated, never evaluated."""

    name: str
    description: str
    parameters: type[BaseModel]
    function: Callable[[Any], Any]  # takes a validated instance of ``parameters``

    def spec(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"additionalProperties": False} | self.parameters.model_json_schema(),
            },
        }

    def call(self, arguments: str | dict) -> str:
        try:
            args = json.loads(arguments, strict=False) if isinstance(arguments, str) else arguments
            return json.dumps(self.function(self.parameters.model_validate(args)))
        except (json.JSONDecodeError, ValidationError, ValueError, TypeError) as exc:
            return json.dumps({"error": clipped(f"{type(exc).__name__}: {exc}", 500)})


@dataclass
class ToolRun:
    final: ChatResult
    calls: list[dict[str, Any]]  # name, arguments, result, in call order
    messages: list[dict[str, Any]]


class EvalClient:
    """One client per (endpoint, model); share it across the stages of a pipeline."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        adapter: str | None = None,
        adapter_prefix: str = "",
        api_key: str = "EMPTY",
        concurrency: int | Literal["auto"] = 16,
        concurrency_ceiling: int = 256,
        timeout: float = 300.0,
        max_retries: int = 8,
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        cache: ResponseCache | None = None,
        default_params: dict[str, Any] | None = None,
        vllm_extensions: bool = True,
        gone: Callable[[], str | None] | None = None,
        reasoning: Reasoning | None = None,
        reasoning_parser: bool | None = None,
        revisions: dict[str, str] | None = None,
        keyed_before: dict[str, str | None] | None = None,
        sample: int | str | None = None,
        batcher: Batcher | None = None,
    ):
        self.base_url = base_url = take_credentials(base_url)  # a URL's user-info: held apart
        # requests bought as batch jobs, in rounds (``serving.batch``); None: one by one
        self.batcher = batcher
        # request name (base model, adapter) -> what it is by content (a digest, a hub commit,
        # what the endpoint reports): part of every cache key, so a retrained adapter or a
        # replaced model is never answered from the cache of the old one
        self.revisions = dict(revisions or {})
        # request name -> the revision its cache keys carried before an endpoint that nothing
        # identifies was known by its URL too (None: no revision): rows keyed so still answer,
        # bound to the first endpoint that asks (``ResponseCache.legacy``)
        self.keyed_before = dict(keyed_before or {})
        # one sample of a self-consistency panel (the member's index) or of an audit's rerun:
        # part of every cache key, so each sample is kept apart (None: the plain request)
        self.sample = sample
        self.gone = gone  # says why the server cannot come back (a lost Ray cluster): no retry
        # () -> [{"node", "pid", "requests"}] of the replicas behind the URL (a Ray Serve app
        # the run started), for the run to report how its requests spread
        self.replicas: Callable[[], list[dict[str, Any]]] | None = None
        self.model = model  # the base model's served name
        self.adapter = adapter  # when set, every request goes to this LoRA adapter
        # Ray Serve LLM routes adapters as BASE:ADAPTER; a plain vLLM server by the bare name.
        # The cache keys the bare name, so both kinds of server share cached answers.
        self.adapter_prefix = adapter_prefix
        self.cache = cache
        self.default_params = dict(default_params or {})
        self.vllm_extensions = vllm_extensions  # choice-constrained decoding via extra_body
        # how the model reasons (None: it is not known to; found from its first reasoning reply)
        self.reasoning = reasoning
        # the server returns reasoning apart from the answer (vLLM's --reasoning-parser): known
        # for a server the project started, else found from the first reply that reasons
        self.reasoning_parser = reasoning_parser
        self.notices: list[str] = []  # said once per client (a model found to reason)
        self.max_retries = max_retries
        self.given_up_in_a_row = 0  # calls whose retries ran out since the last success
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.usage: dict[str, StageUsage] = {}
        self.in_flight = 0
        self.peak_in_flight = 0  # observed concurrency, for accounting and tests
        # requests in flight: a fixed number, or found by AIMD up to the ceiling ("auto")
        self.limit: FixedLimit | AdaptiveLimit = (
            AdaptiveLimit(concurrency_ceiling) if concurrency == "auto" else FixedLimit(concurrency)
        )
        connections = concurrency_ceiling if concurrency == "auto" else concurrency
        self._http = HttpTransport(base_url, api_key, timeout, connections=connections)

    # ---- the one request path -------------------------------------------------------------

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        stage: str = "default",
        template: str | None = None,
        adapter: str | None = None,
        meter: dict[str, StageUsage] | None = None,
        reasoning_log: list[dict[str, Any]] | None = None,
        **params: Any,
    ) -> ChatResult:
        """One chat completion, from the cache when the same request was answered before.

        ``meter`` (optional) receives the same per-stage accounting as the client, e.g. per item;
        ``reasoning_log`` (optional) each reply's reasoning (``--keep-reasoning``).
        ``adapter`` overrides the client's adapter for this request. ``max_tokens`` is what
        the answer needs: a reasoning model's request gets its reasoning budget on top, and a
        reply cut inside its reasoning is asked again with a larger one (``serving.reasoning``);
        still cut at the cap, ``ReasoningCut`` is raised.
        """
        body = {**self.default_params, **params}
        answer = body.get("max_tokens")
        attempt = 0
        while True:
            reasoning = self.reasoning
            sent = dict(body)
            budgets = reasoning.budgets() if reasoning is not None else [0]
            if reasoning is not None:
                sent |= reasoning.params()
                if answer is not None:
                    sent["max_tokens"] = answer + budgets[attempt]
            result = await self._one(messages, sent, stage, template, adapter, meter)
            if result.reasoning:
                self._learn_parser(result)
                if reasoning_log is not None:
                    reasoning_log.append(
                        {
                            "stage": stage,
                            "template": template,
                            "tokens": result.reasoning_tokens,
                            "cut": result.cut_in_reasoning,
                            "reasoning": result.reasoning,
                        }
                    )
            if reasoning is None and result.reasoning:  # a model not known to reason does
                self._found_reasoning()
                if result.cut_in_reasoning and answer is not None:
                    continue  # asked again with the reasoning budget
            if not result.cut_in_reasoning or reasoning is None or answer is None:
                return result
            attempt += 1
            if attempt == len(budgets):
                raise ReasoningCut(stage, sent["max_tokens"])

    @property
    def constrains(self) -> bool:
        """Whether constrained decoding (a choice, a regex, a JSON schema) may be asked for. A
        reasoning model is constrained only where the server parses its reasoning apart: vLLM
        then applies the constraint to the answer alone, while without a parser it would forbid
        the reasoning itself (vLLM's structured-outputs documentation for reasoning models)."""
        reasoning = self.reasoning
        return reasoning is None or not reasoning.on or self.reasoning_parser is True

    def _learn_parser(self, result: ChatResult) -> None:
        apart = not result.inline_reasoning
        if not apart and self.reasoning_parser is not False:
            self._notice(
                f"{self.base_url}: the server returns the reasoning inside the answer (no "
                "--reasoning-parser): the client splits it off at </think> and asks for no "
                "constrained decoding"
            )
        self.reasoning_parser = apart

    def _notice(self, notice: str) -> None:
        self.notices.append(notice)
        print(f"note: {notice}", file=sys.stderr)

    def _found_reasoning(self) -> None:
        self.reasoning = Reasoning.detected()
        notice = (
            f"{self.model}: the model reasons before it answers; each request now gets "
            f"{self.reasoning.budget} reasoning tokens on top of its answer budget "
            "(--reasoning / --reasoning-tokens set this)"
        )
        self._notice(notice)

    async def _one(
        self,
        messages: list[dict[str, Any]],
        body: dict[str, Any],
        stage: str,
        template: str | None,
        adapter: str | None,
        meter: dict[str, StageUsage] | None,
    ) -> ChatResult:
        """One request's answer, from the cache or the endpoint, accounted."""
        model = adapter or self.adapter or self.model
        usage = self.usage.setdefault(stage, StageUsage())
        raw, key = None, ""
        revision = self._revision(model)
        if self.cache is not None or self.batcher is not None:  # the key only where it is used
            payload: dict[str, Any] = {
                "base": self.model,
                "model": model,
                "messages": messages,
                "params": body,
                "template": template,
            }
            if self.sample is not None:
                payload["sample"] = self.sample
            # without revisions (a client built by hand) the key is the one it always was
            key = cache_key(payload | {"revision": revision} if revision else payload)
            # a point read on the cache's own connection; the put below only queues the row for
            # the cache's writer thread: no request waits for SQLite or a thread hop
            raw = self.cache.get(key) if self.cache is not None else None
            if raw is None and revision and self.cache is not None:  # keyed by the rules before
                raw = self._legacy(payload, model, revision)
                if raw is not None:
                    self.cache.put(key, raw, model, revision)
        cached = raw is not None
        if raw is None:
            served = model if model == self.model else self.adapter_prefix + model
            attempts = StageUsage()  # this call's attempts: the stage's and the item's
            try:
                if self.batcher is not None:  # the batch line's custom_id is the cache key
                    raw = await self._batched(key, served, messages, body, attempts, stage)
                else:
                    raw = await self._request(
                        served, messages, body, attempts, stage=stage, template=template
                    )
            finally:
                usage.add(attempts)
                if meter is not None:
                    meter.setdefault(stage, StageUsage()).add(attempts, ATTEMPT_FIELDS)
            if self.cache is not None:
                self.cache.put(key, raw, model, revision)
        else:
            usage.cache_hits += 1
        result = self._result(raw, cached, usage)
        if meter is not None:
            item = meter.setdefault(stage, StageUsage())
            item.calls += 1
            item.cache_hits += cached
            item.prompt_tokens += result.prompt_tokens
            item.completion_tokens += result.completion_tokens
            item.reasoning_tokens += result.reasoning_tokens
        return result

    def _legacy(self, payload: dict[str, Any], model: str, revision: str) -> dict[str, Any] | None:
        """The answer a row keyed by the rules before holds: keyed without revisions, or with
        the revision the endpoint's listing alone gave before its URL counted."""
        assert self.cache is not None
        name = f"{self.model}\0{model}"
        before = self._revision_before(model)
        if before is None:
            return self.cache.legacy(cache_key(payload), name, revision)
        return self.cache.legacy(
            cache_key(payload | {"revision": before}), name, revision, keyed_with=before
        )

    def _revision_before(self, model: str) -> str | None:
        """The revision ``model``'s keys carried before its URL counted (None: none, or no
        change)."""
        if model not in self.keyed_before and self.model not in self.keyed_before:
            return None

        def old(name: str) -> str | None:
            if name in self.keyed_before:
                return self.keyed_before[name]
            return self.revisions.get(name)

        mine = old(model)
        if model == self.model:
            return mine
        base = old(self.model)
        return None if mine is None and base is None else f"{base}+{mine}"

    def _revision(self, model: str) -> str | None:
        """What ``model`` (a request name) is by content, with its base model when it is an
        adapter; None when the client was told nothing."""
        mine = self.revisions.get(model)
        if model == self.model:
            return mine
        base = self.revisions.get(self.model)
        return None if mine is None and base is None else f"{base}+{mine}"

    async def _request(
        self,
        model: str,
        messages: list[dict[str, Any]],
        body: dict[str, Any],
        usage: StageUsage,
        *,
        stage: str,
        template: str | None,
    ) -> dict[str, Any]:
        """The network part of ``chat``: one completion as a plain dict (test doubles replace
        only this, so caching, accounting and parsing stay the real code)."""
        request = wire_request(model, messages, body)
        for attempt in range(self.max_retries + 1):
            started = time.perf_counter()
            try:
                await self.limit.acquire()
                sent = time.perf_counter()  # the limit's latency: without the wait for a slot
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                overloaded = False
                try:
                    response = await self._http.post("/chat/completions", request)
                except TransportError as exc:
                    overloaded = exc.overloaded
                    raise
                finally:
                    self.in_flight -= 1
                    self.limit.release(time.perf_counter() - sent, overloaded)
                usage.requests += 1
                usage.seconds += time.perf_counter() - started
                self.given_up_in_a_row = 0
                return response
            except TransportError as exc:
                if not exc.retryable:  # 4xx: no retry can help
                    usage.failures += 1
                    assert isinstance(exc, StatusError)
                    message = f"{self.base_url}: {exc.status} {exc.message}"
                    if exc.status in ITEM_LEVEL_STATUS:
                        raise RequestRejected(message, stage) from exc
                    raise EndpointError(message) from exc
                reason = self.gone() if self.gone is not None else None
                if attempt == self.max_retries or reason:
                    usage.failures += 1
                    self.given_up_in_a_row += 1
                    message = (
                        f"{self.base_url}: gave up after {attempt + 1} attempts: {reason or exc}"
                    )
                    if reason or not self._fails_items(exc):
                        raise EndpointError(message) from exc
                    raise RequestRejected(message, stage) from exc
                usage.retries += 1
                delay = min(self.max_backoff, self.backoff * 2**attempt) * (0.5 + random.random())
                if exc.retry_after is not None:  # the server said when to come back
                    delay = min(MAX_RETRY_AFTER, exc.retry_after)
                usage.backoff_seconds += delay
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _batched(
        self,
        key: str,
        model: str,
        messages: list[dict[str, Any]],
        body: dict[str, Any],
        usage: StageUsage,
        stage: str,
    ) -> dict[str, Any]:
        """``_request`` as a line of the next batch round: the same request body, answered
        when its batch ends. A line failed in every attempt fails its item; an endpoint that
        cannot run batches stops the run."""
        assert self.batcher is not None
        request = wire_request(model, messages, body)
        started = time.perf_counter()
        try:
            response = await self.batcher.ask(key, request)
        except AskOnline:  # its batch line failed: asked again here, as an online run would
            raw = await self._request(model, messages, body, usage, stage=stage, template=None)
            tokens = raw.get("usage") or {}  # bought online: priced online
            usage.online_prompt_tokens += int(tokens.get("prompt_tokens") or 0)
            usage.online_completion_tokens += int(tokens.get("completion_tokens") or 0)
            return raw
        except LineFailed as exc:
            usage.failures += 1
            raise RequestRejected(f"{self.base_url}: {exc}", stage) from exc
        except BatchError as exc:
            usage.failures += 1
            raise EndpointError(str(exc)) from exc
        usage.requests += 1
        usage.seconds += time.perf_counter() - started
        return response

    def _fails_items(self, exc: TransportError) -> bool:
        """A server that answers, but keeps answering this request with an error (a 5xx, a
        broken body), fails the request's item; one that cannot be reached, or fails every
        request (``GIVE_UP_RUN`` calls given up in a row), stops the run."""
        return not isinstance(exc, ConnectionFault) and self.given_up_in_a_row < GIVE_UP_RUN

    @staticmethod
    def _result(raw: dict[str, Any], cached: bool, usage: StageUsage) -> ChatResult:
        tokens = raw.get("usage") or {}
        reasoning, answer = split_inline(raw["choices"][0]["message"].get("content") or "")
        result = ChatResult(
            text=answer,
            finish_reason=raw["choices"][0].get("finish_reason"),
            prompt_tokens=tokens.get("prompt_tokens", 0),
            completion_tokens=tokens.get("completion_tokens", 0),
            cached=cached,
            raw=raw,
            inline_reasoning=reasoning,
        )
        usage.calls += 1
        usage.prompt_tokens += result.prompt_tokens
        usage.completion_tokens += result.completion_tokens
        usage.reasoning_tokens += result.reasoning_tokens
        return result

    # ---- structured answers ---------------------------------------------------------------

    async def parsed(
        self,
        messages: list[dict[str, Any]],
        parse: Callable[[str], Any],
        expected: str,
        max_reasks: int,
        **kwargs: Any,
    ) -> Parsed:
        """Ask, parse with ``parse(text)``; on failure re-ask up to ``max_reasks`` times with the
        parse error, then give up with status "unparseable" and every raw output."""
        outputs: list[str] = []
        conversation = list(messages)
        for _ in range(max_reasks + 1):
            result = await self.chat(conversation, **kwargs)
            outputs.append(result.text)
            try:
                return Parsed("ok", parse(result.text), outputs=outputs, result=result)
            except (ParseError, ValidationError, ValueError) as exc:
                error = _one_line(exc)
            conversation = conversation[: len(messages)] + [
                {"role": "assistant", "content": result.text},
                *REASK.messages(error=error, expected=expected),
            ]
        return Parsed("unparseable", error=error, outputs=outputs)

    async def structured(
        self,
        messages: list[dict[str, Any]],
        schema: type[T],
        *,
        max_reasks: int = 2,
        constrained: bool = True,
        **kwargs: Any,
    ) -> Parsed:
        """Answer parsed into ``schema``; JSON-schema constrained decoding where supported."""
        if constrained and self.constrains:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema.__name__, "schema": schema.model_json_schema()},
            }

        def parse(text: str) -> T:
            return schema.model_validate(extract_json(text))

        expected = f"a JSON object with the fields {list(schema.model_fields)}"
        return await self.parsed(messages, parse, expected, max_reasks, **kwargs)

    async def choice(
        self,
        messages: list[dict[str, Any]],
        choices: list[str],
        *,
        max_reasks: int = 2,
        **kwargs: Any,
    ) -> Parsed:
        """One of ``choices``; constrained by the server when it is vLLM, else parsed."""
        if self.vllm_extensions and self.constrains:
            extra = dict(kwargs.pop("extra_body", None) or {})
            extra["structured_outputs"] = {"choice": choices}
            kwargs["extra_body"] = extra
        expected = "one of: " + ", ".join(choices)
        return await self.parsed(
            messages, lambda t: match_choice(t, choices), expected, max_reasks, **kwargs
        )

    async def label_score(
        self,
        messages: list[dict[str, Any]],
        labels: Sequence[str] = ("1", "2", "3", "4", "5"),
        *,
        top_logprobs: int = 20,
        max_tokens: int = 8,
        max_reasks: int = 1,
        **kwargs: Any,
    ) -> LabelScore:
        """Probability-weighted label value (e.g. relevance 1–5) from token logprobs."""
        values = {label: float(label) for label in labels}
        # the first answer token is then always a label, renormalised over them
        if self.vllm_extensions and self.constrains:
            extra = dict(kwargs.pop("extra_body", None) or {})
            extra["structured_outputs"] = {"choice": list(labels)}
            kwargs["extra_body"] = extra
        conversation = list(messages)
        result = None
        for _ in range(max_reasks + 1):
            result = await self.chat(
                conversation,
                logprobs=True,
                top_logprobs=top_logprobs,
                max_tokens=max_tokens,
                **{"temperature": 0.0, **kwargs},
            )
            scored = label_score_from_logprobs(result.token_logprobs, values)
            if scored.status == "ok":
                return scored
            conversation = conversation[: len(messages)] + [
                {"role": "assistant", "content": result.text},
                *REASK.messages(error=scored.error, expected="one of " + ", ".join(labels)),
            ]
        return LabelScore("unparseable", output=result.text if result else "", error=scored.error)

    # ---- tool calling ----------------------------------------------------------------------

    async def run_tools(
        self,
        messages: list[dict[str, Any]],
        tools: Sequence[Tool],
        *,
        tool_choice: str | dict = "auto",
        followup_tool_choice: str | dict = "auto",
        max_rounds: int = 4,
        **kwargs: Any,
    ) -> ToolRun:
        """Let the model call ``tools`` for up to ``max_rounds`` rounds, then return its answer."""
        by_name = {t.name: t for t in tools}
        specs = [t.spec() for t in tools]
        conversation = list(messages)
        calls: list[dict[str, Any]] = []
        choice = tool_choice
        for round_ in range(max_rounds + 1):
            last_round = round_ == max_rounds
            result = await self.chat(
                conversation, tools=specs, tool_choice="none" if last_round else choice, **kwargs
            )
            if not result.tool_calls or last_round:
                return ToolRun(result, calls, conversation)
            conversation.append(
                {
                    "role": "assistant",
                    "content": result.text or None,
                    "tool_calls": result.tool_calls,
                }
            )
            for call in result.tool_calls:
                name = call["function"]["name"]
                arguments = call["function"].get("arguments") or "{}"
                tool = by_name.get(name)
                output = tool.call(arguments) if tool else json.dumps({"error": f"no tool {name}"})
                calls.append({"name": name, "arguments": arguments, "result": output})
                conversation.append({"role": "tool", "tool_call_id": call["id"], "content": output})
            choice = followup_tool_choice
        raise AssertionError("unreachable")

    # ---- bookkeeping -----------------------------------------------------------------------

    async def served_models(self) -> list[str] | None:
        """Names the endpoint serves (base models and adapters); None if it does not say."""
        try:
            page = await self._http.get("/models")
            return [str(m["id"]) for m in page["data"]]
        except (TransportError, ValueError, KeyError, TypeError):
            return None

    def usage_report(self) -> dict[str, dict[str, Any]]:
        return {stage: usage.as_dict() for stage, usage in self.usage.items()}

    async def aclose(self) -> None:
        if self.batcher is not None:
            await self.batcher.close()
        await self._http.close()
        if self.cache is not None:  # what this client answered is on disk when it closes
            await asyncio.to_thread(self.cache.flush)

    async def __aenter__(self) -> EvalClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def wire_request(
    model: str, messages: list[dict[str, Any]], body: dict[str, Any]
) -> dict[str, Any]:
    """A chat request in the OpenAI wire format (extra_body's fields at the top level of the
    JSON): what is POSTed online and what a batch line carries."""
    request = {"model": model, "messages": messages}
    request |= {k: v for k, v in body.items() if k != "extra_body"}
    return request | (body.get("extra_body") or {})


def _one_line(exc: BaseException) -> str:
    return clipped(str(exc), 300)
