"""Fine-tuning claim extractors: teacher data (``teacher``), LoRA / QLoRA training (``train``),
evaluation against the teacher (``evaluate``)."""
