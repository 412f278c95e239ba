"""What a person reads in a terminal: at 80 columns (and in a log file, where rich prints 80)
no name or number of a table is cut with "…", all-zero usage columns are left out and named
under the table, a table that cannot fit is stacked; at 120 columns everything is on one line.
Help paragraphs read as paragraphs and each command's entry is one sentence."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.runtime.store.manifest import RunSummary
from groundcover.pipelines.runtime.store.summary import print_summary
from groundcover.pipelines.runtime.terminal import FittedConsole
from tests.support.tables import table_rows

ROOT = Path(__file__).resolve().parents[1]
MODELS = {  # a three-judge panel of long names
    "judge": "Qwen2.5-72B-Instruct-AWQ",
    "judge#2": "meta-llama/Llama-3.1-70B-Instruct",
    "judge#3": "stub-model-b-with-a-very-long-name",
}
STAGES = {"summarize": 16_123, "refine": 9_000, "answer_questions": 1_234_567, "compare": 99_999}


def usage(calls: int, prompt: int, completion: int, reasoning: int = 0) -> dict[str, float]:
    return {
        "calls": calls,
        "requests": calls,
        "cache_hits": 0,
        "retries": 0,
        "failures": 0,
        "backoff_seconds": 0.0,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "reasoning_tokens": reasoning,
    }


def panel_summary() -> RunSummary:
    summary = RunSummary(
        framework="comprehensiveness",
        task="comprehensiveness-qa",
        items=2,
        recorded=2,
        statuses={"ok": 2},
        mean_score=0.5,
        scored_items=2,
        partial=False,
    )
    summary.add(
        usage_this_invocation={s: usage(12, p, 3_000, 7) for s, p in STAGES.items()},
        usage_by_role_this_invocation={
            role: {"model": model, **usage(3, 1_612, 55)} for role, model in MODELS.items()
        },
    )
    return summary


def shown(width: int) -> str:
    out = io.StringIO()
    print_summary(panel_summary(), FittedConsole(file=out, width=width, color_system=None))
    return out.getvalue()


@pytest.mark.parametrize("width", [80, 120])
def test_a_panels_summary_cuts_no_name_or_number(width):
    text = shown(width)
    assert "…" not in text
    rows = table_rows(text)
    roles = {r[0]: r[1:] for r in rows if r and r[0] in MODELS}
    assert {role: cells[0] for role, cells in roles.items()} == MODELS  # whole, judge by judge
    assert all(cells[1:] == ["3", "3", "1,612", "55"] for cells in roles.values())
    stages = {r[0]: r[1:] for r in rows if r and r[0] in STAGES}
    assert {s: cells[2] for s, cells in stages.items()} == {s: f"{p:,}" for s, p in STAGES.items()}
    # the usage columns that are zero in every row are named once under each table, not shown
    assert text.count("all zero: cache hits, retries, failures, backoff s") == 2
    assert "all zero: cache hits, retries, failures, backoff s, reasoning tok" in text
    assert "comprehensiveness-qa: 2/2 recorded" in text  # the title on one line
    if width == 120:  # room for everything: each name and number on one line
        for name in [*MODELS.values(), *STAGES, "1,234,567"]:
            assert any(name in line for line in text.splitlines()), name
    assert max(len(line) for line in text.splitlines()) <= width


def test_a_table_too_wide_for_the_terminal_is_stacked_with_every_value_whole():
    text = shown(40)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 40
    for role in MODELS:
        assert role in text.splitlines()  # each row's heading on its own line
    assert "1,234,567" in text and "prompt tok" in text


@pytest.mark.parametrize("width", ["80", "120"])
def test_report_of_a_fixture_run_cuts_nothing(width):
    run = ROOT / "tests" / "fixtures" / "runs-v2" / "fanoutqa-answers"
    result = CliRunner().invoke(app, ["report", str(run)], env={"COLUMNS": width})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    rows = table_rows(result.output)
    assert ["judge", "grader", "1", "1", "139", "3"] in rows
    assert ["answers", "2", "0.500", "0.500", "0.429", "0.200", "0.429", "absent", "0.500"] in rows


def test_help_paragraphs_read_as_paragraphs_and_each_entry_is_one_sentence():
    listing = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"}).output
    entry = re.search(r"│ serve +(.*?)│\n│ report", listing, re.S)
    assert entry is not None
    text = " ".join(part.strip(" │") for part in entry.group(1).splitlines())
    assert " ".join(text.split()) == (
        "Start the vLLM OpenAI-compatible server for MODEL (plus adapters) and wait."
    )
    page = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "80"}).output
    lines = [line.rstrip() for line in page.splitlines()]
    start = next(k for k, line in enumerate(lines) if "With --nli CHECKPOINT" in line)
    paragraph = lines[start : lines.index("", start)]
    # a line breaks only where the next word would not fit: the docstring's breaks are gone
    for line, after in zip(paragraph, paragraph[1:], strict=False):
        assert len(line) + 1 + len(after.split()[0]) > 79, (line, after)


def test_the_progress_label_names_the_run_on_one_line():
    """The bar gives way, never the label (the run's task: framework and setting)."""
    from groundcover.pipelines.runtime.execution.solve import items_progress

    out = io.StringIO()
    console = FittedConsole(file=out, width=80, color_system=None)
    label = "comprehensiveness-qa: items"
    progress = items_progress(True, console)
    progress.add_task(label, total=2, completed=1)
    console.print(progress.make_tasks_table(progress.tasks))
    (line,) = out.getvalue().splitlines()
    assert line.startswith(label + " ") and line.rstrip().endswith("1/2 0:00:00"), line
