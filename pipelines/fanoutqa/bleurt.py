"""BLEURT with a PyTorch checkpoint given by path (e.g. a BertForSequenceClassification port with
one regression output, such as the Elron/bleurt-* conversions). The original TensorFlow BLEURT is
not installable here; without a configured checkpoint the column is reported as absent."""

from __future__ import annotations

from collections.abc import Sequence


class Bleurt:
    def __init__(self, checkpoint: str, device: str = "cpu", batch_size: int = 32):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.model = AutoModelForSequenceClassification.from_pretrained(checkpoint).to(device)
        self.model.eval()
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"{checkpoint}: a BLEURT checkpoint has one regression output, "
                f"this one has {self.model.config.num_labels}"
            )
        self.device, self.batch_size = device, batch_size

    def score(self, references: Sequence[str], candidates: Sequence[str]) -> list[float]:
        out: list[float] = []
        for start in range(0, len(references), self.batch_size):
            batch = self.tokenizer(
                list(references[start : start + self.batch_size]),
                list(candidates[start : start + self.batch_size]),
                padding="longest",
                truncation=True,
                max_length=512,
                return_tensors="pt",
            ).to(self.device)
            with self.torch.inference_mode():
                out += self.model(**batch).logits[:, 0].float().cpu().tolist()
        return out
