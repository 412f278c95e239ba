"""Adversarial model outputs replayed through every framework's stages with the scripted client.

A ``Case`` is one framework (or one protocol/method of it) on small real inputs, with a
well-formed answer per stage; the ``Adversary`` answers each call with the well-formed answer or
the next output of the adversarial pool, seeded. ``replay`` runs the case through the real
runtime and returns what happened: statuses, escaped exceptions (an ``error`` status is a defect
of ours: no server fault is injected here), lost items, NaNs, scores out of range, and summary
denominators that do not count every item. Used by ``tests/test_faults.py`` and
``scripts/fault_report.py``.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.adversarial import pool
from tests.support.scripted import Reply, ScriptedClient, label

DEFINED = ("ok", "unparseable", "undefined", "abstained")
STAGE_KINDS = {  # what each stage's parser reads (the stage families)
    "lists": {"extract", "revise", "mine", "claims", "topics", "entities"},
    "labels": {"nli", "deflection", "eligibility", "support-all", "support-relevant", "compare"},
    "scores": {"relevance", "refine", "rate", "rate_answer", "comprehensiveness:answer"},
    "JSON": {"aspects", "align_s", "align_a"},
    "citations": {"coverage", "garage:answer"},
    "judge letters": {"judge"},
    "free text": {"summarise", "paragraph", "answer-closed-book", "crux:answer"},
}


def stage_kind(case: str, stage: str) -> str:
    """The kind of output ``stage`` of ``case`` parses ("answer" is a scored list in
    comprehensiveness' Q&A method, free text in CRUX)."""
    keys = {stage, f"{case.split('-')[0]}:{stage}"}
    return next((kind for kind, stages in STAGE_KINDS.items() if keys & stages), "other")


Valid = dict[str, str | Reply | Callable[[str], str | Reply]]


class Adversary:
    """Each call: a well-formed answer for the stage (share ``valid``) or the next adversarial
    output of the pool (no logprobs), seeded; counts the families it sent."""

    def __init__(self, valid_answers: Valid, seed: int, share: float):
        self.valid_answers = valid_answers
        self.outputs = itertools.cycle(pool(seed))
        self.rng = random.Random(seed)
        self.share = share
        self.families: Counter[str] = Counter()
        self.stages: Counter[str] = Counter()  # adversarial outputs sent per stage

    def __call__(self, stage: str, prompt: str) -> Reply:
        answer = self.valid_answers.get(stage)
        if answer is not None and self.rng.random() < self.share:
            answer = answer(prompt) if callable(answer) else answer
            return Reply(answer) if isinstance(answer, str) else answer
        family, text = next(self.outputs)
        self.families[family] += 1
        self.stages[stage] += 1
        return Reply(text)


class AdversarialClient(ScriptedClient):
    """The scripted client (the real EvalClient minus its network call) with one script for
    every stage: the adversary."""

    def __init__(self, adversary: Adversary):
        super().__init__({}, check_constraints=False)
        self.adversary = adversary

    def _next(self, stage: str, prompt: str, body: dict[str, Any] | None = None) -> Reply:
        return self.adversary(stage, prompt)


@dataclass
class Case:
    name: str
    study: Callable[[], Any]
    options: Callable[[Path], Any]  # writes the inputs under the directory, returns the options
    valid: Callable[[], Valid]
    items: dict[str, int]  # outcome key -> items it must have (the inputs')
    share: float = 0.6  # well-formed answers, so later stages are reached too
    # failures recorded inside an ok item (a stage whose unreadable answer the paper counts 0)
    recorded: Callable[[str, Any], int] = lambda key, outcome: 0


@dataclass
class Replay:
    statuses: Counter[str] = field(default_factory=Counter)
    families: Counter[str] = field(default_factory=Counter)
    stages: Counter[str] = field(default_factory=Counter)
    calls: int = 0
    escaped: list[str] = field(default_factory=list)  # `error` records and raised exceptions
    lost: int = 0  # items missing or duplicated
    recorded: int = 0  # unreadable answers recorded inside items that still scored
    problems: list[str] = field(default_factory=list)  # NaN, out of range, bad denominators

    def merge(self, other: Replay) -> None:
        self.statuses += other.statuses
        self.families += other.families
        self.stages += other.stages
        self.calls += other.calls
        self.escaped += other.escaped
        self.lost += other.lost
        self.recorded += other.recorded
        self.problems += other.problems


def replay(case: Case, seed: int, workdir: Path) -> Replay:
    from tests.test_runtime import run

    workdir.mkdir(parents=True, exist_ok=True)
    options = case.options(workdir)
    adversary = Adversary(case.valid(), seed, case.share)
    client = AdversarialClient(adversary)
    out = Replay()
    try:
        outcomes = run(case.study(), options, client, workdir / "run")
    except Exception as exc:  # noqa: BLE001 - counted: the test asserts there are none
        out.escaped.append(f"{type(exc).__name__}: {exc}"[:300])
        return out
    finally:
        out.families, out.stages = adversary.families, adversary.stages
        out.calls = len(client.calls)
    for key, outcome in outcomes.items():
        check_outcome(key, outcome, case.items.get(key), out)
        out.recorded += case.recorded(key, outcome)
    check_files(workdir / "run", out)
    return out


def check_outcome(key: str, outcome: Any, expected: int | None, out: Replay) -> None:
    ids = Counter(r.id for r in outcome.results)
    if expected is not None:
        out.lost += abs(expected - len(ids))
    out.lost += sum(n - 1 for n in ids.values())
    for r in outcome.results:
        out.statuses[r.status] += 1
        if r.status not in DEFINED:
            out.escaped.append(f"{key}/{r.id}: {r.status}: {r.failure}"[:300])
        if not r.explanation:
            out.problems.append(f"{key}/{r.id}: no explanation")
        if r.score is not None and not (math.isfinite(r.score) and 0.0 <= r.score <= 1.0):
            out.problems.append(f"{key}/{r.id}: score {r.score}")
    counted = sum(outcome.summary.statuses.values()) if outcome.summary else 0
    if counted != len(outcome.results):
        out.problems.append(f"{key}: summary counts {counted} of {len(outcome.results)} items")
    summary = outcome.summary.to_json() if outcome.summary else None
    for where, value in walk({"summary": summary, "tables": outcome.tables}):
        if isinstance(value, float) and not math.isfinite(value):
            out.problems.append(f"{key}: {where} = {value}")


def check_files(run_dir: Path, out: Replay) -> None:
    """Every JSON file the run wrote is strict JSON (no NaN / Infinity tokens)."""

    def refuse(token: str) -> None:
        raise ValueError(token)

    for path in sorted(run_dir.rglob("*.json*")):
        lines = path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
        for n, line in enumerate(lines, 1):
            try:
                json.loads(line, parse_constant=refuse)
            except ValueError as exc:
                out.problems.append(f"{path.name}:{n}: {exc}")


def walk(value: Any, where: str = "") -> Any:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, f"{where}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from walk(v, f"{where}[{i}]")
    else:
        yield where, value


# ---- the cases: every framework, on the inputs its own tests use --------------------------------

A = "Eiffel's firm designed the tower."
COMPREHENSIVENESS_VALID: Valid = {
    "summarise": A,
    "extract": f"- {A[:-1]}: Fact\n",
    "revise": f"* {A}\n",
    "relevance": lambda p: (
        f"* {A} [Relevance: 5]\n" if "Rated statements:" in p else label({"5": 0.9, "4": 0.1})
    ),
    "nli": "entailment",
    "mine": "* Who designed the tower?\n",
    "refine": "* Who designed the tower? [Relevance: 5]\n",
    "answer": "* Who designed the tower?\nA: Eiffel's firm [Confidence: 5]\n",
    "compare": "x\nEiffel - firm [equivalent]\n",
    "coverage": "x\n[Covered statements]\n- a [1]\n[Uncovered statements]\n- b [2]\n",
}
COMPREHENSIVENESS_ITEMS = [
    {
        "id": f"i{k}",
        "query": "Who designed the tower?",
        "response": f"Response {k}.",
        "contexts": ["The tower was designed by Eiffel's firm.", "Koechlin drew it."],
    }
    for k in range(8)
]


def comprehensiveness(method: str, protocol: str) -> Case:
    def options(root: Path):
        from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions

        data = root / "items.jsonl"
        data.write_text("".join(json.dumps(i) + "\n" for i in COMPREHENSIVENESS_ITEMS))
        return ComprehensivenessOptions(
            input=data, method=method, protocol=protocol, export_graphs=False, max_reasks=1
        )

    def study():
        from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS

        return COMPREHENSIVENESS

    # NLI has the longest chain of stages per item: more well-formed answers to get through it
    return Case(
        f"comprehensiveness-{method}-{protocol}",
        study,
        options,
        lambda: COMPREHENSIVENESS_VALID,
        {"": len(COMPREHENSIVENESS_ITEMS)},
        share=0.9 if method == "nli" else 0.6,
    )


ICAT_COPIES = 10


def icat() -> Case:
    def options(root: Path):
        from groundcover.pipelines.icat.framework import IcatOptions
        from tests.test_icat import write_inputs

        paths = write_inputs(root)  # 3 responses of systems A and B; 10 copies of each
        rows = [json.loads(line) for line in paths["responses"].read_text().splitlines()]
        paths["responses"].write_text(
            "".join(
                json.dumps(r | {"system": f"{r['system']}{k}"}) + "\n"
                for k in range(ICAT_COPIES)
                for r in rows
            )
        )
        return IcatOptions(
            input=paths["responses"],
            queries=paths["queries"],
            qrels=paths["qrels"],
            snippets=paths["snippets"],
            variants=["m", "s", "a"],
            nli_model="stand-in",
            betas=[1.0, 2.0],
            max_reasks=1,
        )

    def study():
        from tests.test_icat import P_ENTAIL, StandInIcat

        return StandInIcat(P_ENTAIL)

    def valid() -> Valid:
        from tests.test_icat import SCRIPTS

        return SCRIPTS

    return Case("icat", study, options, valid, {"": 3 * ICAT_COPIES}, share=0.7)


def garage() -> Case:
    def options(root: Path):
        from groundcover.pipelines.garage.framework import GarageOptions
        from tests.test_runtime import garage_records

        return GarageOptions(input=garage_records(root))

    def study():
        from groundcover.pipelines.garage.framework import GARAGE

        return GARAGE

    def valid() -> Valid:
        from tests.test_runtime import GARAGE_SCRIPTS

        return GARAGE_SCRIPTS

    return Case("garage", study, options, valid, {"": 3}, share=0.5)


FANOUT_COPIES = 10


def fanoutqa() -> Case:
    def options(root: Path):
        from groundcover.pipelines.fanoutqa.framework import FanoutOptions
        from tests.test_runtime import FANOUT

        dev = root / "dev.json"
        dev.write_text(
            json.dumps([q | {"id": f"{q['id']}-{k}"} for k in range(FANOUT_COPIES) for q in FANOUT])
        )
        return FanoutOptions(input=dev, judge=True)

    def study():
        from groundcover.pipelines.fanoutqa.framework import FANOUTQA

        return FANOUTQA

    def valid() -> Valid:
        from tests.test_runtime import FANOUT_SCRIPTS

        return FANOUT_SCRIPTS

    def unjudged(key: str, outcome: Any) -> int:  # counted 0 over all questions, as the original
        return (outcome.tables or {}).get("judge_unparseable", 0)

    return Case(
        "fanoutqa",
        study,
        options,
        valid,
        {"closed-book": 3 * FANOUT_COPIES},
        share=0.5,
        recorded=unjudged,
    )


CRUX_TOPICS = 6


def crux() -> Case:
    """Six topics of the CRUX test's shape; the judge rates the pairs the file lacks and a
    generated answer."""

    def options(root: Path):
        from groundcover.pipelines.crux.framework import CruxOptions
        from tests.test_crux import RATINGS, TEXTS

        topics = [f"t{k}" for k in range(CRUX_TOPICS)]
        files = {
            "topics": [
                {"topic": t, "query": "q", "questions": ["Q0?", "Q1?", "Q2?", "Q3?"]}
                for t in topics
            ],
            "passages": [
                {"id": f"{t}-{p}", "topic": t, "text": x} for t in topics for p, x in TEXTS.items()
            ],
            "ratings": [
                {"topic": t, "passage_id": f"{t}-{p}", "question": q, "rating": r}
                for t in topics
                for p, row in RATINGS.items()
                for q, r in enumerate(row)
            ],
        }
        paths = {}
        for name, rows in files.items():
            paths[name] = root / f"{name}.jsonl"
            paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
        run = root / "run.trec"
        run.write_text(
            "".join(
                f"{t} Q0 {t}-{p} {r} 9.0 sys\n"
                for t in topics
                for r, p in enumerate(["p4", "p2", "p3"], 1)
            )
        )
        return CruxOptions(
            input=run,
            topics=paths["topics"],
            passages=paths["passages"],
            ratings=paths["ratings"],
            rate=True,
            generate=True,
            answer_tokens=64,
        )

    def study():
        from groundcover.pipelines.crux.framework import CRUX

        return CRUX

    valid: Valid = {
        "rate": "Rating: 4",
        "answer": "An answer from the passages.",
        "rate_answer": "3",
    }

    def unreadable(key: str, outcome: Any) -> int:
        return sum(r.details.get("unreadable", 0) for r in outcome.results)

    return Case(
        "crux", study, options, lambda: valid, {"": CRUX_TOPICS}, share=0.6, recorded=unreadable
    )


def teacher() -> Case:
    def options(root: Path):
        from groundcover.pipelines.finetune.teacher import TeacherOptions

        return TeacherOptions(n_topics=4, entities=2, validation=0.0)

    def study():
        from groundcover.pipelines.finetune.teacher import TEACHER_DATA

        return TEACHER_DATA

    valid: Valid = {
        "topics": "- Rivers\n- Music\n- Cities\n- Trees\n",
        "entities": "- Danube\n- Rhine\n",
        "paragraph": lambda p: f"About {p[-40:]!r}: it is well known.",
        "claims": "- It is well known.\n",
    }
    return Case("finetune-teacher", study, options, lambda: valid, {"topics": 1}, share=0.4)


def cases() -> list[Case]:
    return [
        *(comprehensiveness(m, p) for m in ("e2e", "qa", "nli") for p in ("paper", "spec")),
        icat(),
        garage(),
        fanoutqa(),
        crux(),
        teacher(),
    ]
