"""Recipe: GRPO on GSM8K with Qwen2.5-0.5B-Instruct (GPU); ``prepare.py`` converts the data."""
