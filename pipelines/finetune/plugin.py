"""What claim-extractor fine-tuning plugs into the runtime: its studies and the commands that
run them (`finetune claims train` and `register` are plain commands of the CLI layer)."""

from groundcover import Command, Flag, flags

STUDIES = (
    "groundcover.pipelines.finetune.teacher:TEACHER_DATA",
    "groundcover.pipelines.finetune.teacher:TOPIC_BATCHES",
    "groundcover.pipelines.finetune.teacher:EXAMPLES",
    "groundcover.pipelines.finetune.evaluate:CLAIMS_EVAL",
    "groundcover.pipelines.finetune.evaluate:COMPARE",
)
COMMANDS = (
    Command(
        "finetune claims data",
        "groundcover.pipelines.finetune.teacher:TEACHER_DATA",
        "Teacher data for a claim extractor: topics -> entities -> paragraphs -> claims from the "
        "teacher model (--model / --endpoint).",
        "Writes train.jsonl, validation.jsonl and data_card.json in the run directory. Resumable.",
        flags=flags("topics", "n_topics", "entities", "validation"),
    ),
    Command(
        "finetune claims eval",
        "groundcover.pipelines.finetune.evaluate:COMPARE",
        "A claim extractor's claims vs the teacher's on the validation split: precision, recall, "
        "F1, claims per paragraph, unparseable rate; base model and adapter side by side.",
        flags=(
            Flag("metric.input", argument=True, required=True),
            Flag("metric.extractor", help="adapter name to compare with the base model"),
            *flags("metric.matcher", "metric.nli_model", "metric.limit"),
        ),
    ),
)
