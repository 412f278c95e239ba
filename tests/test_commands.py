"""Framework commands declared once: flags generated from the options models' fields, built
lazily (``--help`` loads no framework), and frameworks free of any CLI library."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from groundcover.pipelines.cli.frameworks import build, option_field
from groundcover.pipelines.runtime.contract.commands import Command, Flag
from groundcover.pipelines.runtime.contract.config import SHARED_OPTIONS
from groundcover.pipelines.runtime.contract.plugins import commands, plugins


def _framework_modules_after(code: str) -> list[str]:
    """The framework modules (``pipelines.<package>.framework``) loaded by ``code`` run first in
    a fresh interpreter."""
    listing = "sorted(m for m in sys.modules if m.endswith('.framework'))"
    probe = f"import json, sys\n{code}\nprint(json.dumps({listing}))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cli(argv: list[str]) -> str:
    return (
        "from groundcover.pipelines.cli.main import app\n"
        f"try:\n    app({argv!r}, prog_name='groundcover')\nexcept SystemExit:\n    pass"
    )


@pytest.mark.parametrize("argv", [["--help"], ["eval", "--help"], ["reproduce", "--help"]])
def test_help_and_group_listings_import_no_framework(argv):
    assert _framework_modules_after(_cli(argv)) == []


def test_a_command_imports_its_own_framework_when_it_shows_its_help():
    loaded = _framework_modules_after(_cli(["eval", "garage", "--help"]))
    assert loaded == ["groundcover.pipelines.garage.framework"]


@pytest.mark.parametrize("package", [p.value.removesuffix(".plugin") for p in plugins()])
def test_no_framework_imports_a_cli_library(package):
    """Importing every study of a package, first in a fresh interpreter, loads no typer."""
    code = (
        "import sys\n"
        f"from groundcover.pipelines.runtime.contract.commands import load_object\n"
        f"import {package}.plugin as plugin\n"
        "for ref in plugin.STUDIES:\n"
        "    load_object(ref)\n"
        "print('typer' in sys.modules, 'groundcover.pipelines.cli' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False False"


@pytest.mark.parametrize("path", sorted(commands()))
def test_every_declared_flag_is_a_field_with_help(path):
    """Each flag names a field of its study's options (or a role), and its help text comes
    from there: a renamed or removed field fails here, not at a user's command line."""
    spec = commands()[path]
    study = spec.load_study()
    for flag in spec.flags:
        if flag.role is None:
            info = option_field(study.Options, flag.field)
            assert flag.help or info.description, (path, flag.field, "no help text")
        else:
            assert flag.role in study.roles, (path, flag.role)
        assert flag.param not in {o.name for o in SHARED_OPTIONS}, (path, flag.param)
    built = build(spec)
    own = {p.name for p in built.params} - {o.name for o in SHARED_OPTIONS}
    assert own == {f.param for f in spec.flags}
    for param in built.params:
        if param.name in own:
            assert getattr(param, "help", None) or param.param_type_name == "argument"


def test_help_shows_the_models_defaults_and_choices():
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app

    out = CliRunner().invoke(app, ["eval", "comprehensiveness", "--help"])
    assert out.exit_code == 0
    text = "".join(c for c in out.output if c not in "│ \n")  # rich wraps lines in boxes
    assert "[nli|qa|e2e]" in text  # the Literal's choices
    assert "[default:(3.5)]" in text  # t_rel's default, from the model
    assert "keepcontextatoms/questionsscoring>=this" in text  # the field's description


def test_overrides_from_flags():
    spec = Command(
        "eval x",
        "m:X",
        "x",
        flags=(
            Flag("input", argument=True),
            Flag("variants", name="variant", comma=True),
            Flag("metric.limit"),
            Flag("roles.extract", name="extractor"),
            Flag("settings", name="setting"),
        ),
        fixed={"dataset": "d"},
    )
    given = {
        "input": Path("a.jsonl"),
        "variant": "m, s,,a",
        "limit": 3,
        "extractor": "claims",
        "setting": ["evidence"],
    }
    assert spec.overrides(given) == {
        "input": "a.jsonl",
        "variants": ["m", "s", "a"],
        "metric.limit": 3,
        "roles.extract": {"adapter": "claims"},
        "settings": ["evidence"],
        "dataset": "d",
    }
    # a flag not given stays None: the YAML file or the model's default stands
    assert spec.overrides({})["variants"] is None


def test_reproduce_crux_data_folder_fills_the_files_not_given(tmp_path):
    from groundcover.pipelines.crux.reproduce import ReproduceCruxOptions

    for name in ("topics", "passages", "ratings"):
        (tmp_path / f"{name}.jsonl").write_text("")
    options = ReproduceCruxOptions(data=tmp_path, topics=Path("mine.jsonl"))
    assert options.topics == Path("mine.jsonl")
    assert options.passages == tmp_path / "passages.jsonl"
    assert options.ratings == tmp_path / "ratings.jsonl"
