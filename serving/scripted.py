"""A scripted judge for exact-score tests (``groundcover.testing``): replays scripted outputs
(and logprobs) per stage in place of an endpoint.

``ScriptedClient`` is the real ``EvalClient`` with only its network call replaced, so caching,
accounting, re-asks, label scoring and parsing all run the production code. Each stage has a
script: a string (always that output), a list (outputs in call order) or a function of the
prompt. When the client asks for constrained decoding, the scripted output must satisfy the
constraint (regex or choice) — a script a real server could not produce fails the test.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .client import EvalClient, StageUsage

_MARKER = re.compile(r"(Relevance|Confidence)\s*:\s*(?=[1-5])", re.IGNORECASE)


@dataclass
class Reply:
    text: str = ""
    logprobs: list[dict[str, Any]] | None = None  # the response's logprobs.content
    tool_calls: list[dict[str, Any]] | None = None
    error: Exception | None = None  # raised instead of answering


@dataclass
class Sampled:
    """A script that also reads the request's sampling parameters (``seed``, ``temperature``):
    ``fn(prompt, body)``, where body holds what the client sent besides the messages."""

    fn: Callable[[str, dict[str, Any]], str | Reply]


Script = str | Reply | list[str | Reply] | Callable[[str], str | Reply] | Sampled


@dataclass
class Call:
    stage: str
    model: str
    prompt: str  # the first user message (the rendered template)
    messages: list[dict[str, Any]]
    body: dict[str, Any]
    output: str


def label(distribution: dict[str, float]) -> Reply:
    """A one-token label answer whose top alternatives carry ``distribution``."""
    top: list[dict[str, Any]] = [
        {"token": k, "logprob": math.log(p)} for k, p in distribution.items() if p > 0
    ]
    best = max(top, key=lambda t: float(t["logprob"]))
    return Reply(str(best["token"]), [{**best, "top_logprobs": top}])


def marked(text: str, distributions: list[dict[str, float]]) -> Reply:
    """``text`` with a token distribution at each '[Relevance|Confidence: n]' digit, in order."""
    tokens: list[dict[str, Any]] = []
    last = 0
    positions = [m.end() for m in _MARKER.finditer(text)]
    if len(positions) != len(distributions):
        raise ValueError(f"{len(positions)} markers but {len(distributions)} distributions")
    for end, distribution in zip(positions, distributions, strict=True):
        if end > last:
            tokens.append({"token": text[last:end], "logprob": 0.0, "top_logprobs": []})
        digit = (label(distribution).logprobs or [])[0]
        if digit["token"] != text[end]:
            raise ValueError(f"the text says {text[end]} but the distribution's mode is {digit}")
        tokens.append(digit)
        last = end + 1
    tokens.append({"token": text[last:], "logprob": 0.0, "top_logprobs": []})
    return Reply(text, tokens)


def rated(distribution: dict[str, float]) -> Callable[[str], Reply]:
    """A relevance script for both protocols: every statement of a per-source prompt (paper)
    rated with ``distribution`` at its marker, or the one label of a per-atom prompt (spec)."""

    def reply(prompt: str) -> Reply:
        if "Rated statements:" not in prompt:
            return label(distribution)
        block = prompt.rsplit("Statements:", 1)[1].split("Rated statements:")[0]
        lines = [line for line in block.splitlines() if line.startswith("* ")]
        digit = max(distribution, key=distribution.__getitem__)
        text = "".join(f"{line} [Relevance: {digit}]\n" for line in lines)
        return marked(text, [distribution] * len(lines))

    return reply


END_OF_TURN = {"token": "<|im_end|>", "logprob": 0.0, "top_logprobs": []}


def end_of_turn(reply: Reply) -> list[dict[str, Any]]:
    """The token generation stopped on, listed after the answer's as vLLM lists it, where the
    reply's logprobs spell its whole text (a script that gives some positions only is left so)."""
    spelled = "".join(str(t.get("token", "")) for t in reply.logprobs or [])
    return [dict(END_OF_TURN)] if reply.text and spelled == reply.text else []


def tool_call(name: str, arguments: str, call_id: str = "call-1") -> Reply:
    return Reply(
        "",
        tool_calls=[
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    )


def field_of(prompt: str, name: str) -> str:
    """The value after the last '<name>: ' line of a rendered prompt."""
    found = re.findall(rf"^\s*{re.escape(name)}:[ \t]*(.*)$", prompt, re.MULTILINE)
    if not found:
        raise AssertionError(f"no {name!r} line in prompt:\n{prompt}")
    return found[-1].strip()


def by_text(mapping: dict[str, str | Reply], prompt: str) -> str | Reply:
    """The reply whose key occurs in the prompt (exactly one key must)."""
    hits = [key for key in mapping if key in prompt]
    if len(hits) != 1:
        raise AssertionError(f"{len(hits)} script keys in prompt {prompt[-300:]!r}: {hits}")
    return mapping[hits[0]]


class ScriptedClient(EvalClient):
    """The real ``EvalClient`` answering from ``scripts`` (stage -> a string, a list of
    outputs in call order, a function of the rendered prompt, or ``Sampled``) instead of a
    server. ``calls`` keeps every request (``stage_calls(stage)`` per stage), so a test counts
    them; ``check_constraints`` refuses an output a real server could not give under the
    request's constrained decoding; ``reasons`` answers like a model that reasons first."""

    def __init__(
        self,
        scripts: dict[str, Script],
        *,
        check_constraints: bool = True,
        keep_calls: bool = True,
        reasons: int = 0,
        logprobs_with_reasoning: bool = False,
        **kwargs: Any,
    ):
        kwargs.setdefault("max_retries", 0)
        super().__init__("http://scripted.invalid/v1", kwargs.pop("model", "scripted"), **kwargs)
        self.scripts = {k: list(v) if isinstance(v, list) else v for k, v in scripts.items()}
        self.check_constraints = check_constraints
        self.calls: list[Call] = []
        self.keep_calls = keep_calls  # off in memory benchmarks: the log is the double's cost
        # Shaped like vLLM serving a reasoning model (gpt-oss): ``reasons`` reasoning tokens
        # before every answer, returned in ``reasoning``; max_tokens bounds both, so a request
        # whose budget ends inside the reasoning gets finish_reason "length" and no content.
        # ``logprobs_with_reasoning``: the logprobs list the reasoning's tokens too (servers
        # differ), before the answer's.
        self.reasons = reasons
        self.logprobs_with_reasoning = logprobs_with_reasoning

    def stage_calls(self, stage: str) -> list[Call]:
        return [c for c in self.calls if c.stage == stage]

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
        try:
            raw = self.respond(model, messages, body, stage)
        except Exception:
            usage.failures += 1
            raise
        usage.requests += 1
        return raw

    def respond(
        self, model: str, messages: list[dict[str, Any]], body: dict[str, Any], stage: str
    ) -> dict[str, Any]:
        """The completion a server would send for this request (raises a scripted error)."""
        # The template's prompt: re-asks and tool results come after it in ``messages``.
        prompt = next((m["content"] for m in messages if m["role"] == "user"), "")
        limit = body.get("max_tokens")
        if self.reasons and limit is not None and limit <= self.reasons:  # no script consumed
            if self.keep_calls:
                self.calls.append(Call(stage, model, prompt, messages, body, ""))
            cut = {"role": "assistant", "content": None, "reasoning": "hmm " * limit}
            ended = {"index": 0, "message": cut, "finish_reason": "length"}
            tokens = {
                "prompt_tokens": len(prompt.split()),
                "completion_tokens": limit,
                "completion_tokens_details": {"reasoning_tokens": limit},
            }
            return {"choices": [ended], "usage": tokens, "model": model}
        reply = self._next(stage, prompt, body)
        if self.keep_calls:
            self.calls.append(Call(stage, model, prompt, messages, body, reply.text))
        if reply.error is not None:
            raise reply.error
        if self.check_constraints:
            _check_constraint(stage, body, reply.text)
        if self.reasons:
            return self._reasoned(reply, prompt, body, model)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "stop"}
        if reply.logprobs is not None:
            choice["logprobs"] = {"content": reply.logprobs + end_of_turn(reply)}
        tokens = {
            "prompt_tokens": len(prompt.split()),
            "completion_tokens": len(reply.text.split()),
        }
        return {"choices": [choice], "usage": tokens, "model": model}

    def _reasoned(
        self, reply: Reply, prompt: str, body: dict[str, Any], model: str
    ) -> dict[str, Any]:
        """The reply after ``self.reasons`` reasoning tokens, cut where max_tokens ends (a
        token is a word here)."""
        limit = body.get("max_tokens")
        thought = self.reasons  # the request left room for it (``_request`` cut it otherwise)
        message: dict[str, Any] = {"role": "assistant", "reasoning": " ".join(["hmm"] * thought)}
        room = None if limit is None else limit - thought
        words = reply.text.split()
        if room is not None and len(words) > room:  # cut inside the answer
            message["content"] = " ".join(words[:room])
            finish, answer = "length", room
        else:
            message["content"] = reply.text
            finish, answer = "stop", len(words)
            if reply.tool_calls:
                message["tool_calls"] = reply.tool_calls
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        if reply.logprobs is not None and finish == "stop":
            before = [{"token": "hmm ", "logprob": -0.1, "top_logprobs": []}] * thought
            listed = before if self.logprobs_with_reasoning else []
            choice["logprobs"] = {"content": listed + reply.logprobs + end_of_turn(reply)}
        tokens = {
            "prompt_tokens": len(prompt.split()),
            "completion_tokens": thought + answer,
            "completion_tokens_details": {"reasoning_tokens": thought},
        }
        return {"choices": [choice], "usage": tokens, "model": model}

    def _next(self, stage: str, prompt: str, body: dict[str, Any] | None = None) -> Reply:
        if stage not in self.scripts:
            raise AssertionError(f"no script for stage {stage!r}; prompt:\n{prompt}")
        script = self.scripts[stage]
        if isinstance(script, list):
            if not script:
                raise AssertionError(f"stage {stage!r} was called more often than scripted")
            script = script.pop(0)
        elif isinstance(script, Sampled):
            script = script.fn(prompt, body or {})
        elif callable(script):
            script = script(prompt)
        return Reply(script) if isinstance(script, str) else script


def _check_constraint(stage: str, body: dict[str, Any], text: str) -> None:
    constraint = (body.get("extra_body") or {}).get("structured_outputs") or {}
    if "regex" in constraint and not re.fullmatch(constraint["regex"], text):
        raise AssertionError(f"stage {stage}: scripted output breaks the regex: {text!r}")
    if "choice" in constraint and text not in constraint["choice"]:
        raise AssertionError(f"stage {stage}: {text!r} is not one of {constraint['choice']}")
