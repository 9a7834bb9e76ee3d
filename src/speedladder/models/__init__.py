"""Any PyTorch language model as one ModelDef (models/definition.py): our GPT (gpt, presets, ours), a Hugging
Face causal LM (hf) or the user's own (user); `build` makes one, `detect` finds its facts (docs/models.md)."""
