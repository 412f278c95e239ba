"""The NLI cross-encoder on tiny DeBERTa-v2 and BERT checkpoints built in the session."""

from __future__ import annotations

import numpy as np
import pytest

from groundcover.retrieval.nli import CANONICAL, NliModelError, NliScorer, canonical_columns
from tests.support.tiny import build_tiny_classifier

PAIRS = [
    ("The river is long and wide and flows north.", "The river flows."),
    ("x", "y"),
    ("Paris is the capital of France.", "France has a capital city called Paris, they say."),
    ("one two three", "four"),
    ("The report was published in 2020 by the city council.", "The council wrote a report."),
]


@pytest.fixture(scope="session", params=["deberta-v2", "bert"])
def checkpoint(request, tmp_path_factory):
    return build_tiny_classifier(tmp_path_factory.mktemp(request.param), request.param)


def test_shapes_and_probabilities(checkpoint):
    probs = NliScorer(str(checkpoint), batch_size=2).probabilities(PAIRS)
    assert probs.shape == (len(PAIRS), 3)
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert NliScorer(str(checkpoint)).probabilities([]).shape == (0, 3)


def test_length_sorted_batches_return_rows_in_input_order(checkpoint):
    scorer = NliScorer(str(checkpoint), batch_size=2)
    batched = scorer.probabilities(PAIRS)
    one_by_one = np.vstack([scorer.probabilities([pair]) for pair in PAIRS])
    assert np.allclose(batched, one_by_one, atol=1e-4)  # padding and sorting change nothing
    assert scorer.labels(PAIRS) == [CANONICAL[i] for i in one_by_one.argmax(axis=1)]


def test_label_order_is_read_from_the_checkpoint(tmp_path):
    # Same weights (seed), labels declared in a different order: canonical columns follow names.
    a = NliScorer(
        str(
            build_tiny_classifier(tmp_path / "a", labels=("ENTAILMENT", "NEUTRAL", "CONTRADICTION"))
        )
    )
    b = NliScorer(
        str(
            build_tiny_classifier(tmp_path / "b", labels=("contradiction", "entailment", "neutral"))
        )
    )
    pa, pb = a.probabilities(PAIRS), b.probabilities(PAIRS)
    # b's raw column 0 is "contradiction": a's raw column 0 is "entailment".
    assert np.allclose(pa[:, 0], pb[:, 2], atol=1e-5)
    assert np.allclose(pa[:, 1], pb[:, 0], atol=1e-5)
    assert np.allclose(pa[:, 2], pb[:, 1], atol=1e-5)


def test_label_aliases_and_missing_labels():
    assert canonical_columns({0: "CONTRADICTION", 1: "Neutral", 2: "entailment"}) == [2, 1, 0]
    with pytest.raises(NliModelError, match="lack"):
        canonical_columns({0: "LABEL_0", 1: "LABEL_1"})


def test_supported_by_any_passage(checkpoint):
    scorer = NliScorer(str(checkpoint))
    claim = "The river flows."
    passages = [p for p, _ in PAIRS]
    probs = scorer.probabilities([(p, claim) for p in passages])
    assert scorer.supported(claim, passages) == bool((probs.argmax(axis=1) == 0).any())
    assert scorer.supported(claim, passages, threshold=0.0) is True
    assert scorer.supported(claim, passages, threshold=1.01) is False
    assert scorer.supported(claim, []) is False


def tokenizer_padded(scorer: NliScorer, pairs, padding: str) -> np.ndarray:
    """What the scorer computed before it tokenised once: the tokenizer pads each batch."""
    out = np.zeros((len(pairs), 3), dtype=np.float32)
    for rows in scorer.plan(pairs):
        batch = scorer.tokenizer(
            [pairs[i][0] for i in rows],
            [pairs[i][1] for i in rows],
            padding=padding,
            truncation=True,
            max_length=scorer.max_length,
            return_tensors="pt",
        )
        with scorer.torch.inference_mode():
            logits = scorer.model(**batch).logits.float()
        out[rows] = scorer.torch.softmax(logits, dim=-1)[:, scorer.columns].numpy()
    return out


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "fixed"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_one_tokenisation_gives_the_tokenizer_padded_batches(checkpoint, dynamic, side):
    """The ids tokenised once and padded by the scorer are the tokenizer's own padded batches:
    same probabilities; and the tokenizer runs once per call (it ran twice: plan, then batch)."""
    scorer = NliScorer(str(checkpoint), batch_size=2, max_length=24, dynamic_padding=dynamic)
    scorer.tokenizer.padding_side = side
    pairs = PAIRS + [("a much longer premise " * 12, "and a hypothesis cut by max_length")]
    expected = tokenizer_padded(scorer, pairs, "longest" if dynamic else "max_length")
    scorer.tokenizer = counting = CountingTokenizer(scorer.tokenizer)
    assert np.array_equal(scorer.probabilities(pairs), expected)
    assert counting.calls == 1


class CountingTokenizer:
    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)
