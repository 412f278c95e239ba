"""The public face keeps its word: every name ``groundcover`` exported before it was grouped by
theme still imports from it, with a DeprecationWarning that names its new home, and a framework
written against that face loads and scores as it did."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import groundcover

FIXTURE = Path(__file__).parent / "fixtures" / "frameworks" / "last_week.py"

# the root's names before the regrouping (git show a4f70db:groundcover/__init__.py, __all__)
EARLIER_FACE = """
MANIFEST NLI_PLACEMENT PLACEMENT_FIELDS RESULTS AnswerFile Average Command Content EvalClient
Evaluation EvaluatorConfig Flag Framework FrameworkOptions GivenAnswers HumanLabel IndexDir
InputDir InputFile Interval ItemContext ItemResult ItemText Judgement LabelScore ModelGrid
ModelName NliPlacement NotContent PanelRule ParseError Parsed PromptTemplate Published RecordId
RoleSpec RunOutcome RunPlan RunRequest StageFailed StageFailure Status Strict Study SwapPair
Tool UserError Vote atomic_write_json bca_interval bullet_list bullets cell_text
describe_validation evaluate extract_json flags iter_jsonl load_dir load_variants model_name
not_scored paired_test placement_of precision_recall_f1 published_row read_jsonl read_manifest
read_text responder_config results_by_id role_evaluator score_item solve_item
""".split()


@pytest.mark.parametrize("name", EARLIER_FACE)
def test_every_earlier_name_still_imports_and_a_moved_one_says_where(name):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(groundcover, name)
    moved = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    if name in groundcover.__all__:
        assert not moved  # still at the root: no warning
        return
    assert len(moved) == 1, name
    message = str(moved[0].message)
    assert f"groundcover.{name} has moved" in message and groundcover.REMOVED_IN in message
    home = message.split("import it from ", 1)[1].split(";")[0].split(" ")[0]
    if home.endswith("(internal)") or "." in home.removeprefix("groundcover."):
        return  # no public home: the internal module is named, which the value came from
    assert getattr(__import__(home, fromlist=[name]), name) is value  # the same object there
    assert moved[0].filename == __file__  # the warning points at the line that used the name


def test_a_name_never_public_is_still_an_attribute_error():
    with pytest.raises(AttributeError):
        groundcover.no_such_name  # noqa: B018


def test_last_weeks_one_file_framework_loads_with_warnings_and_scores_as_worked_out(tmp_path):
    """by hand: yes, partly, no -> 1, 0.5, 0 -> mean 0.5"""
    import hashlib
    import sys

    from groundcover.pipelines.runtime.contract.plugins import from_file, module_name
    from groundcover.testing import ScriptedClient, field_of

    digest = hashlib.sha256(FIXTURE.read_bytes()).hexdigest()
    sys.modules.pop(module_name(digest), None)  # loaded by another test: again
    with pytest.warns(DeprecationWarning) as caught:
        _, found = from_file(str(FIXTURE))
    moved = {str(w.message).split(" ")[0] for w in caught}
    assert moved == {"groundcover.RecordId", "groundcover.bca_interval", "groundcover.read_jsonl"}
    answers = {"Paris.": "yes", "Blue, mostly.": "partly", "I like tea.": "no"}
    items = tmp_path / "items.jsonl"
    rows = [{"id": f"q{k}", "question": f"Q{k}?", "answer": a} for k, a in enumerate(answers)]
    items.write_text("".join(json.dumps(row) + "\n" for row in rows))
    judge = ScriptedClient({"last-week": lambda prompt: answers[field_of(prompt, "Answer")]})
    done = groundcover.evaluate(
        found,
        options={"input": str(items)},
        client=judge,
        run={"run_dir": str(tmp_path / "run"), "cache": None},
    )
    assert [r.score for r in done.results] == [1.0, 0.5, 0.0]
    assert done.tables is not None and done.tables["mean"] == 0.5
