"""What claim-extractor fine-tuning plugs into the runtime: its studies and the commands that
run them (`finetune claims train` and `register` are plain commands of the CLI layer)."""

from pipelines.runtime.commands import Command, Flag, flags

STUDIES = (
    "pipelines.finetune.teacher:TEACHER_DATA",
    "pipelines.finetune.teacher:TOPIC_BATCHES",
    "pipelines.finetune.teacher:EXAMPLES",
    "pipelines.finetune.evaluate:CLAIMS_EVAL",
    "pipelines.finetune.evaluate:COMPARE",
)
COMMANDS = (
    Command(
        "finetune claims data",
        "pipelines.finetune.teacher:TEACHER_DATA",
        "Teacher data for a claim extractor: topics -> entities -> paragraphs -> claims from the "
        "teacher model (--model / --endpoint).",
        "Writes train.jsonl, validation.jsonl and data_card.json in the run directory. Resumable.",
        flags=flags("topics", "n_topics", "entities", "validation"),
    ),
    Command(
        "finetune claims eval",
        "pipelines.finetune.evaluate:COMPARE",
        "A claim extractor's claims vs the teacher's on the validation split: precision, recall, "
        "F1, claims per paragraph, unparseable rate; base model and adapter side by side.",
        flags=(
            Flag("metric.input", argument=True, required=True),
            Flag("metric.extractor", help="adapter name to compare with the base model"),
            *flags("metric.matcher", "metric.nli_model", "metric.limit"),
        ),
    ),
)
