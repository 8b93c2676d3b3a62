"""The OpenAI-compatible endpoint: ``skyrl-serve`` for inference, and sessions that train an
external agent (``generator.agent`` naming ``async def rollout(client, row)``)."""
