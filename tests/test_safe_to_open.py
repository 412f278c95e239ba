"""Opening a run never runs code from it: a run directory sent by someone else, whose manifest
names a framework file planted beside it (relative, inside the run, or with another digest), is
read by ``report``, ``compare``, ``agreement`` and the exports from its records and summary
alone, with one line saying so; the planted code never runs. Even the file at its recorded
absolute path with its recorded SHA-256 is loaded only once the user trusts it (``groundcover
trust FILE``) or names it again (``--framework``); ``tests/test_sent_runs.py`` holds the rest."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import groundcover

FIXTURE = Path(__file__).parent / "fixtures" / "frameworks" / "last_week.py"
ANSWERS = {"Paris.": "yes", "Blue, mostly.": "partly", "I like tea.": "no"}


def planted(marker: Path) -> str:
    """A framework file that leaves ``marker`` behind if anything imports it."""
    return f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A finished run of the one-file framework (scripted judge: 1, 0.5, 0)."""
    from groundcover.pipelines.runtime.contract.plugins import from_file
    from groundcover.testing import ScriptedClient, field_of

    root = tmp_path_factory.mktemp("made")
    framework = root / "last_week.py"
    shutil.copy(FIXTURE, framework)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _, found = from_file(str(framework))
    items = root / "items.jsonl"
    rows = [{"id": f"q{k}", "question": f"Q{k}?", "answer": a} for k, a in enumerate(ANSWERS)]
    items.write_text("".join(json.dumps(row) + "\n" for row in rows))
    judge = ScriptedClient({"last-week": lambda prompt: ANSWERS[field_of(prompt, "Answer")]})
    groundcover.evaluate(
        found,
        options={"input": str(items)},
        client=judge,
        run={"run_dir": str(root / "run"), "cache": None},
    )
    return root


def groundcover_cli(
    *args: str, cwd: Path, home: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The command in a process of its own (``home``: its GROUNDCOVER_HOME, its trust list)."""
    command = [sys.executable, "-W", "ignore::DeprecationWarning", "-m", "groundcover", *args]
    env = os.environ | ({"GROUNDCOVER_HOME": str(home)} if home else {})
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def sent(made: Path, tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A copy of the run as someone else sends it, its manifest pointing at a planted file:
    ``relative`` (read against wherever the reader stands), ``inside`` (an absolute path into
    the run, with the planted file's own digest) or ``digest`` (the real path, another file)."""
    run = tmp_path / "inbox" / "run"
    shutil.copytree(made / "run", run)
    marker = tmp_path / "ran"
    code = planted(marker)
    manifest = json.loads((run / "manifest.json").read_text())
    if how == "relative":
        (tmp_path / "inbox" / "last_week.py").write_text(code)
        (run / "last_week.py").write_text(code)
        manifest["source"]["file"] = "last_week.py"
    elif how == "inside":
        (run / "last_week.py").write_text(code)
        manifest["source"]["file"] = str(run / "last_week.py")
        manifest["source"]["sha256"] = __import__("hashlib").sha256(code.encode()).hexdigest()
    else:
        elsewhere = tmp_path / "elsewhere.py"
        elsewhere.write_text(code)
        manifest["source"]["file"] = str(elsewhere)
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run, marker


@pytest.mark.parametrize("how", ["relative", "inside", "digest"])
def test_a_planted_framework_file_never_runs_and_the_run_is_read_from_its_records(
    made, tmp_path, how
):
    run, marker = sent(made, tmp_path, how)
    inbox = run.parent
    report = groundcover_cli("report", "run", cwd=inbox)
    assert report.returncode == 0, report.stderr[-2000:]
    notes = [line for line in report.stderr.splitlines() if "not loaded" in line]
    assert len(notes) == 1 and "records and summary alone" in notes[0]
    assert "3/3 recorded" in report.stdout  # the summary, from the records
    if how != "relative":  # one rule refuses all three: the other commands once suffice
        assert not marker.exists()
        return
    as_json = groundcover_cli("report", "run", "--json", cwd=inbox)
    payload = json.loads(as_json.stdout.splitlines()[0])
    assert payload["summary"]["mean_score"] == 0.5 and payload["tables"] is None
    out = tmp_path / "rows.csv"
    exported = groundcover_cli("report", "run", "--export", str(out), "--html", "p.html", cwd=inbox)
    assert exported.returncode == 0, exported.stderr[-2000:]
    with out.open(newline="") as handle:
        scores = {row["id"]: float(row["score"]) for row in csv.DictReader(handle)}
    assert scores == {"q0": 1.0, "q1": 0.5, "q2": 0.0}
    assert (inbox / "p.html").is_file()
    assert groundcover_cli("agreement", "run", cwd=inbox).returncode == 0
    twin = inbox / "twin"
    shutil.copytree(run, twin)
    compared = groundcover_cli("compare", "run", "twin", "--json", cwd=inbox)
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert not marker.exists()  # nothing of the run's ever ran


def test_the_file_at_its_recorded_path_loads_once_trusted_and_so_does_one_named_again(
    made, tmp_path
):
    home = tmp_path / "home"  # this test's own trust list
    untrusted = groundcover_cli("report", str(made / "run"), "--json", cwd=tmp_path, home=home)
    assert untrusted.returncode == 0, untrusted.stderr[-2000:]
    assert json.loads(untrusted.stdout.splitlines()[0])["tables"] is None
    assert "`groundcover trust FILE` or --framework FILE" in untrusted.stderr
    trusted = groundcover_cli("trust", str(made / "last_week.py"), cwd=tmp_path, home=home)
    assert trusted.returncode == 0, trusted.stderr[-2000:]
    report = groundcover_cli("report", str(made / "run"), "--json", cwd=tmp_path, home=home)
    assert report.returncode == 0, report.stderr[-2000:]
    assert json.loads(report.stdout.splitlines()[0])["tables"]["mean"] == 0.5
    assert "not loaded" not in report.stderr
    run, marker = sent(made, tmp_path, "relative")
    named = groundcover_cli(
        "report", "run", "--json", "--framework", str(made / "last_week.py"), cwd=run.parent
    )
    assert named.returncode == 0, named.stderr[-2000:]
    assert json.loads(named.stdout.splitlines()[0])["tables"]["mean"] == 0.5
    assert "not loaded" not in named.stderr and not marker.exists()
