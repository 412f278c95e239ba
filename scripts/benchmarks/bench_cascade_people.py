"""Trust or escalate on people's own labels: WikiContradict's human evaluation, 300 answers of
five LLMs to 12 questions whose sources conflict, each graded by people Correct, Partially correct
or Incorrect against what its setting expects (the one context's answer where the model was given
one context; both conflicting answers where it was given none or both). Each judge tier grades
every answer once (``prompts/grade_answer.yaml``, the grade constrained to the three, its
confidence the probability of the grade's own tokens, as ``--confidence logprobs`` records it);
then, over seeded draws that split the questions into a calibration part and a check part (a
question's answers stay together), the cascade is calibrated at each alpha (delta split between
the tiers) and run on the check part: coverage, agreement with people, the draws where it fell
below 1 - alpha, the strongest tier's calls saved, and the strongest tier alone.

    python scripts/benchmarks/bench_cascade_people.py                 # the embedded model alone
    python scripts/benchmarks/bench_cascade_people.py \\
        --tier gpt-oss-20b@http://gpu-a:8000/v1 --tier gpt-oss-120b@http://gpu-b:8000/v1

A tier with no ``@URL`` is served here (the embedded default: SmolLM2-135M on the CPU, which
proves the path and is far too weak to judge). A grade without a confidence (unparseable, or
given without logprobs) is the least confident, 0, in calibrating and in checking alike; an
unparseable one never agrees.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from groundcover.pipelines.reports.audits.cascade import (  # noqa: E402
    Guarantee,
    TierUnits,
    calibrate,
    calibrate_cascade,
    proportion_interval,
    route,
)
from groundcover.pipelines.runtime.contract.errors import UserError  # noqa: E402
from groundcover.pipelines.runtime.contract.readers import iter_jsonl  # noqa: E402
from groundcover.serving.cache import ResponseCache  # noqa: E402
from groundcover.serving.client import EvalClient  # noqa: E402
from groundcover.serving.templates import PromptTemplate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "wikicontradict" / "humaneval-dev.jsonl"
PROMPT = PromptTemplate.load(Path(__file__).parent / "prompts" / "grade_answer.yaml")
# the annotators' grades as the judge's choices (words no other choice contains)
GRADES = {"Correct": "correct", "Partially correct": "partial", "Incorrect": "incorrect"}
RESPONSES = 5  # answer0..4: no context, context 1, context 2, both, both with a hint
ALPHAS = (0.05, 0.1, 0.2)


@dataclass(frozen=True)
class Graded:
    """One answer people graded, with what its setting expects."""

    question: str  # also the unit of the split: a question's answers go together
    expected: tuple[str, ...]
    answer: str
    human: str  # the annotators' grade, as a choice of GRADES


def read_graded(path: Path) -> list[Graded]:
    """The authors' rows (question, gt_answer_1/2, answer0..4, label0..4), five answers each;
    a bad row stops with one line naming the file, the row and the field."""
    found = []
    for lineno, row in iter_jsonl(path):
        texts = ["question", "gt_answer_1", "gt_answer_2"] + [f"answer{k}" for k in range(5)]
        for name in texts:
            if not isinstance(row.get(name), str) or not row[name].strip():
                raise UserError(f"{path}:{lineno}: row {lineno}: field {name}: missing or not text")
        both = (row["gt_answer_1"], row["gt_answer_2"])
        for k in range(RESPONSES):
            grade = GRADES.get(str(row.get(f"label{k}", "")).strip().capitalize())
            if grade is None:
                raise UserError(
                    f"{path}:{lineno}: row {lineno}: field label{k}: "
                    f"{row.get(f'label{k}')!r} is none of {list(GRADES)}"
                )
            expected = (both[k - 1],) if k in (1, 2) else both
            found.append(Graded(row["question"], expected, row[f"answer{k}"], grade))
    if not found:
        raise UserError(f"{path}: no rows")
    return found


@dataclass
class TierGrades:
    """One tier's grade and confidence for every answer (None: no parseable grade, or no
    logprobs to give it a confidence), and whether each grade is the people's."""

    tier: str
    grades: list[str | None]
    confidences: list[float | None]
    agrees: list[bool]
    usage: dict[str, int]

    @property
    def ranked(self) -> list[float]:
        """The confidences the thresholds are compared with: none is the least, 0."""
        return [c or 0.0 for c in self.confidences]


async def grade_all(client: EvalClient, tier: str, graded: list[Graded]) -> TierGrades:
    """Every answer graded once by ``client``, the grade's probability from its logprobs."""

    async def one(item: Graded) -> tuple[str | None, float | None]:
        values = {"question": item.question, "expected": list(item.expected)}
        parsed = await client.choice(
            PROMPT.messages(**values, answer=item.answer),
            list(GRADES.values()),
            stage="grade",
            template=PROMPT.id,
            logprobs=True,
            temperature=0.0,
            max_tokens=8,
        )
        if not parsed.ok:
            return None, None
        confidence = parsed.result.label_probability(parsed.value) if parsed.result else None
        return parsed.value, confidence

    answered = await asyncio.gather(*(one(item) for item in graded))
    used = client.usage["grade"]
    usage = {
        "calls": used.calls,
        "requests": used.requests,
        "prompt_tokens": used.prompt_tokens,
        "completion_tokens": used.completion_tokens,
    }
    grades = [g for g, _ in answered]
    agrees = [g == item.human for g, item in zip(grades, graded, strict=True)]
    return TierGrades(tier, grades, [c for _, c in answered], agrees, usage)


def split(graded: list[Graded], seed: int, check_share: float) -> tuple[list[int], list[int]]:
    """The answers that calibrate and those that check, by a seeded draw of whole questions."""
    questions = sorted({g.question for g in graded})
    rng = np.random.default_rng(seed)
    checked = set(rng.permutation(questions)[: max(1, round(len(questions) * check_share))])
    calibrating = [i for i, g in enumerate(graded) if g.question not in checked]
    return calibrating, [i for i, g in enumerate(graded) if g.question in checked]


def units(tier: TierGrades, at: list[int]) -> TierUnits:
    ranked = tier.ranked
    return TierUnits(tier.tier, [ranked[i] for i in at], [tier.agrees[i] for i in at])


def one_draw(
    tiers: list[TierGrades], graded: list[Graded], guarantee: Guarantee, seed: int, share: float
) -> dict[str, Any]:
    """Calibrate on one part, run the cascade and the strongest tier alone on the other."""
    calibrating, checking = split(graded, seed, share)
    made = calibrate_cascade([units(t, calibrating) for t in tiers], guarantee)
    thresholds = [t["threshold"] for t in made["tiers"]]
    ranked = [t.ranked for t in tiers]
    kept = right = strongest_asked = 0
    for i in checking:
        k = route([r[i] for r in ranked], thresholds)
        if k is None or k == len(tiers) - 1:
            strongest_asked += 1
        if k is not None:
            kept += 1
            right += tiers[k].agrees[i]
    strongest = units(tiers[-1], calibrating)
    alone = calibrate(strongest.confidences, strongest.agrees, guarantee).threshold
    alone_kept = [i for i in checking if alone is not None and ranked[-1][i] >= alone]
    return {
        "coverage": kept / len(checking),
        "agreement": right / kept if kept else None,
        "saved": 1 - strongest_asked / len(checking),
        "alone_coverage": len(alone_kept) / len(checking),
        "alone_agreement": (
            sum(tiers[-1].agrees[i] for i in alone_kept) / len(alone_kept) if alone_kept else None
        ),
        "first_attainable": made["tiers"][0]["attainable"],
        "first_labels_needed": made["tiers"][0]["labels_needed"],
    }


def summary(draws: list[dict[str, Any]], alpha: float) -> dict[str, Any]:
    """Medians over the draws; the guarantee's failures among the draws that kept anything."""
    agreements = [d["agreement"] for d in draws if d["agreement"] is not None]
    alone = [d["alone_agreement"] for d in draws if d["alone_agreement"] is not None]
    return {
        "alpha": alpha,
        "draws": len(draws),
        "coverage": statistics.median(d["coverage"] for d in draws),
        "agreement": statistics.median(agreements) if agreements else None,
        "kept_any": len(agreements),
        "below": sum(a < 1 - alpha for a in agreements),
        "saved": statistics.median(d["saved"] for d in draws),
        "alone_coverage": statistics.median(d["alone_coverage"] for d in draws),
        "alone_agreement": statistics.median(alone) if alone else None,
        "first_attainable": sum(d["first_attainable"] for d in draws),
        "first_labels_needed": statistics.median(d["first_labels_needed"] for d in draws),
    }


def setting_baseline(graded: list[Graded]) -> float:
    """Agreement of a judge that never reads the answer: the most common grade of each setting
    (one expected answer or two) -- how much of the task the setting alone gives away."""
    by_setting: dict[int, Counter[str]] = {}
    for g in graded:
        by_setting.setdefault(len(g.expected), Counter())[g.human] += 1
    return sum(c.most_common(1)[0][1] for c in by_setting.values()) / len(graded)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def render(tiers: list[TierGrades], graded: list[Graded], rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{len(graded)} answers graded by people, {len({g.question for g in graded})} questions"
    ]
    lines.append(
        f"a judge that never reads the answer (each setting's commonest grade): "
        f"{setting_baseline(graded):.1%}"
    )
    for tier in tiers:
        agreeing = sum(tier.agrees)
        low, high = proportion_interval(agreeing, len(graded)) or [0.0, 0.0]
        missing = sum(c is None for c in tier.confidences)
        lines.append(
            f"tier {tier.tier}: agrees with people on {agreeing}/{len(graded)} "
            f"({agreeing / len(graded):.1%}, 95% {low:.1%}-{high:.1%}); no grade or confidence "
            f"{missing}; {tier.usage['calls']} calls, {tier.usage['prompt_tokens']} prompt + "
            f"{tier.usage['completion_tokens']} completion tokens; grades "
            f"{dict(Counter(g or 'none' for g in tier.grades))}"
        )
    lines += [
        "",
        "| alpha | cascade coverage | agreement (median) | draws below 1 - alpha | strongest "
        "calls saved | strongest alone: coverage | its agreement | tier 1 attainable | tier 1 "
        "labels needed (median) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        saved = _percent(row["saved"]) if len(tiers) > 1 else "- (one tier)"
        lines.append(
            f"| {row['alpha']} | {row['coverage']:.1%} | {_percent(row['agreement'])} | "
            f"{row['below']} of {row['kept_any']} | {saved} | {row['alone_coverage']:.1%} | "
            f"{_percent(row['alone_agreement'])} | {row['first_attainable']} of {row['draws']} | "
            f"{row['first_labels_needed']:g} |"
        )
    return "\n".join(lines)


def parse_tier(spec: str) -> tuple[str, str | None]:
    model, _, url = spec.partition("@")
    return model, url or None


async def grade_tiers(
    endpoints: list[tuple[str, str, str]], graded: list[Graded], args: argparse.Namespace
) -> list[TierGrades]:
    tiers: list[TierGrades] = []
    for label, url, served in endpoints:
        cache = ResponseCache(Path(args.cache) / f"{len(tiers)}.sqlite") if args.cache else None
        async with EvalClient(url, served, concurrency=args.concurrency, cache=cache) as client:
            tiers.append(await grade_all(client, label, graded))
    return tiers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the authors' humaneval rows")
    parser.add_argument(
        "--tier", action="append", help="MODEL[@URL], cheapest first (default: embedded)"
    )
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--check-share", type=float, default=0.3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--cache", help="a folder for the tiers' response caches")
    parser.add_argument("--json", type=Path, help="write the grades and the table here")
    args = parser.parse_args()
    try:
        graded = read_graded(args.data)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from groundcover.serving.launch.server import endpoint_or_local

    with ExitStack() as stack:
        endpoints = []
        for spec in args.tier or ["embedded"]:
            model, url = parse_tier(spec)
            base, served = stack.enter_context(endpoint_or_local(model, url))
            endpoints.append((model, base, served))
        tiers = asyncio.run(grade_tiers(endpoints, graded, args))
    rows = []
    for alpha in ALPHAS:
        guarantee = Guarantee(alpha, args.delta)
        draws = [
            one_draw(tiers, graded, guarantee, seed, args.check_share) for seed in range(args.draws)
        ]
        rows.append(summary(draws, alpha))
    print(
        f"{args.draws} draws, {args.check_share:.0%} of the questions checked, delta {args.delta}"
    )
    print(render(tiers, graded, rows))
    if args.json:
        tiers_out = [t.__dict__ for t in tiers]
        args.json.write_text(json.dumps({"tiers": tiers_out, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
