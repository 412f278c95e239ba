import math

import pytest

from groundcover.serving.client import label_score_from_logprobs

LABELS = {str(i): float(i) for i in range(1, 6)}


def position(token, alternatives):
    return {
        "token": token,
        "logprob": dict(alternatives).get(token, -1.0),
        "top_logprobs": [{"token": t, "logprob": lp} for t, lp in alternatives],
    }


def test_weighted_score_renormalised_over_labels():
    alts = [("4", math.log(0.5)), ("5", math.log(0.2)), ("x", math.log(0.2)), ("3", math.log(0.1))]
    scored = label_score_from_logprobs([position("4", alts)], LABELS)
    assert scored.status == "ok"
    # labels carry 0.8 of the mass: 4*0.5/0.8 + 5*0.2/0.8 + 3*0.1/0.8
    assert scored.score == pytest.approx((4 * 0.5 + 5 * 0.2 + 3 * 0.1) / 0.8)
    assert scored.label_mass == pytest.approx(0.8)
    assert sum(scored.distribution.values()) == pytest.approx(1.0)


def test_whitespace_variants_merge_and_masked_tokens_count_zero():
    alts = [("2", math.log(0.3)), (" 2", math.log(0.3)), ("1", math.log(0.4)), ("zz", -9999.0)]
    scored = label_score_from_logprobs([position(" 2", alts)], LABELS)
    assert scored.distribution == pytest.approx({"2": 0.6, "1": 0.4})
    assert scored.score == pytest.approx(2 * 0.6 + 1 * 0.4)


def test_first_label_position_is_used():
    prefix = position("Score", [("Score", -0.1), ("3", -3.0)])
    label = position(":", [(":", -0.1)])
    value = position("5", [("5", math.log(0.9)), ("4", math.log(0.1))])
    scored = label_score_from_logprobs([prefix, label, value], LABELS)
    assert scored.score == pytest.approx(5 * 0.9 + 4 * 0.1)
    assert scored.output == "Score:5"


def test_no_label_is_unparseable_not_zero():
    scored = label_score_from_logprobs([position("maybe", [("maybe", -0.1)])], LABELS)
    assert scored.status == "unparseable"
    assert scored.score is None
    assert "no label" in scored.error


def test_score_always_within_label_range():
    alts = [
        (str(i), math.log(w)) for i, w in zip(range(1, 6), [0.1, 0.2, 0.3, 0.2, 0.2], strict=True)
    ]
    scored = label_score_from_logprobs([position("3", alts)], LABELS)
    assert 1.0 <= scored.score <= 5.0


def test_marker_scores_follow_each_marker_in_order():
    from groundcover.serving.client import marker_label_scores

    def tok(t, alts=None):
        return {
            "token": t,
            "logprob": -0.1,
            "top_logprobs": alts or [{"token": t, "logprob": -0.1}],
        }

    tokens = [
        tok("* Q1 "),
        tok("[Relevance"),
        tok(":"),
        tok(
            " 4",
            [
                {"token": " 4", "logprob": math.log(0.75)},
                {"token": " 5", "logprob": math.log(0.25)},
            ],
        ),
        tok("]\n* Q2 has 3 parts "),
        tok("[Relevance:"),
        tok("2"),
        tok("]"),
    ]
    scores = marker_label_scores(tokens, "Relevance", LABELS)
    assert [round(s.score, 6) for s in scores] == [4.25, 2.0]  # the bare "3" is not after a marker
