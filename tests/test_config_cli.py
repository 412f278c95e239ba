"""Bad configuration and input: one clear line, exit code 2, no run directory written."""

import json

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, UserError, load_config
from groundcover.pipelines.runtime.contract.plugins import plugins
from groundcover.pipelines.runtime.contract.readers import items_digest, read_jsonl
from groundcover.pipelines.runtime.store.lines import FileChanged
from groundcover.pipelines.shared.answering import GenerateItem

runner = CliRunner()


def run(args):
    return runner.invoke(app, args, catch_exceptions=False)


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"id": "a", "question": "why?"}) + "\n")
    return path


def test_the_cli_imports_no_statistics_or_model_library_until_a_command_needs_one():
    """Every CLI process (and every test that spawns one) pays for what `pipelines.cli` imports:
    scipy.stats, torch and transformers load only where a command uses them."""
    import subprocess
    import sys

    probe = (
        "import sys, groundcover.pipelines.cli; print(sorted(m for m in sys.modules if m in {}))"
    )
    heavy = {"scipy.stats", "torch", "transformers", "sentence_transformers", "ray", "vllm"}
    command = [sys.executable, "-c", probe.format(sorted(heavy))]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.parametrize("package", [p.value.removesuffix(".plugin") for p in plugins()])
def test_each_framework_imports_first_in_a_fresh_interpreter(package):
    """A framework imported before the CLI (a notebook, a script, a Ray worker) loads: the CLI
    package builds its app only when asked for it, so no import runs in a circle."""
    import subprocess
    import sys

    command = [sys.executable, "-c", f"import {package}"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_command_has_help():
    commands = [
        [],
        ["serve"],
        ["models"],
        ["prompts"],
        ["generate"],
        ["report"],
        ["eli5"],
        ["eval"],
        ["eval", "comprehensiveness"],
        ["eval", "garage"],
        ["eval", "fanoutqa"],
        ["meta-eval"],
        ["meta-eval", "wikicontradict"],
        ["meta-eval", "conflictbank"],
        ["eval", "icat"],
        ["reproduce", "comprehensiveness"],
        ["index"],
        ["data"],
        ["data", "get"],
    ]
    for command in commands:
        result = run([*command, "--help"])
        assert result.exit_code == 0, command
        assert "Usage" in result.output


def test_missing_input_file(tmp_path):
    result = run(["generate", str(tmp_path / "nope.jsonl"), "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "input file not found" in result.output
    assert not (tmp_path / "r").exists()


def test_bad_record_names_file_line_record_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "question": "ok?"}\n{"id": "b", "question": ""}\n')
    result = run(["generate", str(path), "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "bad.jsonl:2: record 'b': field question" in " ".join(result.output.split())
    assert not (tmp_path / "r").exists()


def test_yaml_unknown_field_and_bad_value(tmp_path, questions):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("evaluator:\n  modle: x\n")
    result = run(["generate", str(questions), "--config", str(cfg)])
    assert result.exit_code == 2
    assert "field evaluator.modle: Extra inputs are not permitted" in result.output
    cfg.write_text("evaluator:\n  concurrency: 0\n")
    result = run(["generate", str(questions), "--config", str(cfg)])
    assert result.exit_code == 2
    assert "evaluator.concurrency" in result.output


def test_flags_override_yaml(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: gpt-oss-20b\nmax_tokens: 100\n")
    loaded = load_config(EvaluatorConfig, cfg, {"max_tokens": 7, "model": None})
    assert (loaded.model, loaded.max_tokens) == ("gpt-oss-20b", 7)


def test_invalid_yaml_and_missing_config(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("evaluator: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(EvaluatorConfig, cfg, {})
    with pytest.raises(UserError, match="config file not found"):
        load_config(EvaluatorConfig, tmp_path / "missing.yaml", {})


def test_adapter_path_checked_before_anything_starts(tmp_path, questions):
    result = run(["generate", str(questions), "--lora", f"x={tmp_path}"])
    assert result.exit_code == 2
    assert "no adapter_config.json" in result.output
    result = run(["generate", str(questions), "--lora", "no-equals-sign"])
    assert result.exit_code == 2
    assert "NAME=PATH" in result.output


def test_unknown_model(tmp_path, questions):
    result = run(["generate", str(questions), "--model", "gpt-5-ultra", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown model 'gpt-5-ultra'" in result.output


def test_read_jsonl_errors(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"id": "a", "question": "q"}\n{not json}\n')
    with pytest.raises(UserError, match=r"x.jsonl:2: not valid JSON"):
        read_jsonl(path, GenerateItem)
    path.write_text('{"id": "a", "question": "q"}\n{"id": "a", "question": "r"}\n')
    with pytest.raises(UserError, match="duplicate id"):
        read_jsonl(path, GenerateItem)
    path.write_text("[1, 2]\n")
    with pytest.raises(UserError, match="must be a JSON object"):
        read_jsonl(path, GenerateItem)
    path.write_text("\n")
    with pytest.raises(UserError, match="no records"):
        read_jsonl(path, GenerateItem)


def test_prompts_are_printable():
    listed = run(["prompts"])
    assert "answer@v1#" in listed.output
    shown = run(["prompts", "answer"])
    assert "Question: {{ question }}" in shown.output
    assert run(["prompts", "nope"]).exit_code == 2


def test_models_lists_presets():
    output = run(["models"]).output
    for name in (
        "gpt-oss-20b",
        "gpt-oss-120b",
        "Llama-3.1-8B-Instruct",
        "Qwen2.5-72B-Instruct",
        "icat-claims",
    ):
        assert name in output


@pytest.mark.parametrize(
    "command",
    [
        ["generate"],
        ["eval", "comprehensiveness"],
        ["eval", "garage"],
        ["eval", "fanoutqa"],
        ["meta-eval", "wikicontradict"],
        ["eli5"],
    ],
)
def test_shared_options_appear_once_in_one_group(command):
    from groundcover.pipelines.runtime.contract.config import SHARED_OPTIONS

    output = run([*command, "--help"]).output
    panel = output.index("Evaluator and run")
    for option in SHARED_OPTIONS:
        flag = "--" + option.name.replace("_", "-")
        assert output.count(f"{flag} ") == 1, (command, flag)
        assert output.index(f"{flag} ") > panel, (command, flag)


def test_binary_input_file_is_one_line_error(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(b'{"id": "a", "question": "ok?"}\n\xff\xfe\x00garbage\n')
    result = run(["generate", str(path), "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "q.jsonl:2: not UTF-8 text" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_adapter_that_is_not_served_is_refused_before_anything_starts(tmp_path, questions):
    for args in (["--adapter", "claims"], ["--model", "embedded:claims"]):
        result = run(["generate", str(questions), *args, "--run-dir", str(tmp_path / "r")])
        assert result.exit_code == 2, args
        assert "adapter 'claims' is not served by this run: add --lora" in result.output
        assert not (tmp_path / "r").exists()


def test_a_colon_names_an_adapter_only_when_that_adapter_is_known(tmp_path):
    import json

    from groundcover.serving.launch.adapters import register
    from groundcover.serving.launch.registry import ModelRef

    url = "http://127.0.0.1:1/v1"
    # An endpoint's model named with a colon (ollama style) is a model, not model + adapter.
    ev = EvaluatorConfig(model="llama3:8b", endpoint=url)
    assert (ev.model, ev.adapter) == ("llama3:8b", None)
    # The adapter named explicitly, or registered here, makes the suffix an adapter.
    ev = EvaluatorConfig(model="Qwen2.5-7B-Instruct:claims", endpoint=url, adapter="claims")
    assert (ev.model, ev.adapter) == ("Qwen2.5-7B-Instruct", "claims")
    source = tmp_path / "adapter"
    source.mkdir()
    (source / "adapter_config.json").write_text(json.dumps({"r": 8}))
    register("known-claims", source)
    ev = EvaluatorConfig(model="Qwen2.5-7B-Instruct:known-claims", endpoint=url)
    assert (ev.model, ev.adapter) == ("Qwen2.5-7B-Instruct", "known-claims")
    # At an endpoint, what the server lists decides (checked when the client opens).
    ref = ModelRef("base:tag", url)
    assert ref.split_at(["base", "tag"]) == ModelRef("base", url, "tag")
    assert ref.split_at(["base:tag", "tag"]) == ref and ref.split_at(["base"]) == ref


def test_report_refuses_what_is_not_a_run(tmp_path):
    result = run(["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a run directory" in result.output


def test_replicas_are_checked_before_anything_starts(tmp_path, questions):
    for args, message in (
        (["--replicas", "2", "--endpoint", "http://127.0.0.1:9/v1"], "only without --endpoint"),
        (["--replicas", "2", "--lora", f"x={tmp_path}"], "no adapter_config.json"),
    ):
        result = run(["generate", str(questions), *args, "--run-dir", str(tmp_path / "r")])
        assert result.exit_code == 2 and message in result.output, result.output
        assert not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match="only for an --endpoint"):
        EvaluatorConfig(adapter_prefix="embedded:")


def test_items_read_on_use_equal_an_eager_read(tmp_path):
    """Items kept as byte offsets parse to what reading every line at once gives, with the
    same content digest (the run identity), also for a limit and a subset."""
    path = tmp_path / "items.jsonl"
    lines = [
        '\ufeff{"id": "q1", "question": "a?"}',
        "",
        '{"question": "b?", "contexts": ["x"]}',
        '{"id": 7, "query": "c?"}',
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    eager = [
        GenerateItem(id="q1", question="a?"),
        GenerateItem(id="3", question="b?", contexts=["x"]),  # id: its line number
        GenerateItem(id="7", question="c?"),
    ]
    view = read_jsonl(path, GenerateItem)
    assert list(view) == eager and view[2] == eager[2] and view.ids == ["q1", "3", "7"]
    assert view.digest == items_digest(list(eager))
    limited = read_jsonl(path, GenerateItem, limit=2)
    assert list(limited) == eager[:2] and items_digest(limited) == items_digest(eager[:2])
    taken = view.take([2, 0])
    assert list(taken) == [eager[2], eager[0]] and taken.ids == ["7", "q1"]
    assert items_digest(taken) == items_digest([eager[2], eager[0]])
    path.write_text(path.read_text() + '{"id": "q1", "question": "again"}\n')
    with pytest.raises(UserError, match=r"items.jsonl:5: record 'q1': duplicate id"):
        read_jsonl(path, GenerateItem, limit=1)  # records past the limit are still checked


def test_items_file_changed_after_validation_is_refused(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text('{"id": "a", "question": "q?"}\n{"id": "b", "question": "r?"}\n')
    view = read_jsonl(path, GenerateItem)
    assert view[1].question == "r?"
    path.write_text('{"id": "a", "question": "q?"}\n{"id": "b", "question": "s?"}\n')
    with pytest.raises(FileChanged, match=r"items.jsonl: changed while the run was reading it"):
        view[1]


@pytest.mark.parametrize(
    ("command", "wanted"),
    [
        (
            ["reproduce", "crux"],
            "groundcover reproduce crux needs --topics and --passages, or --data",
        ),
        (["generate"], "groundcover generate needs INPUT"),
        (["eval", "crux", "run.trec"], "groundcover eval crux: Missing option '--topics'."),
        (["eval", "garage", "--bogus"], "groundcover eval garage: No such option: --bogus"),
        (["index", "build"], "groundcover index build: Missing argument 'corpus'."),
        (["no-such-command"], "groundcover: No such command 'no-such-command'."),
    ],
)
def test_a_missing_or_unknown_option_is_one_line_naming_what_to_give(command, wanted):
    result = CliRunner().invoke(app, command, prog_name="groundcover")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == [f"error: {wanted} (see --help)"], result.output
