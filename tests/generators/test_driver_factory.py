"""``generator.agent`` naming an external agent: an ``async def`` that cannot be called as
``rollout(client, row)`` is refused up front, naming the key."""

import pytest

from skyrl.config.errors import ConfigError
from skyrl.generators import driver_factory


async def rollout(client, row):
    """A well-formed external agent."""
    return 1.0


async def rollout_of_row(row):
    """Forgot the client."""
    return 1.0


async def rollout_with_extra(client, row, tries):
    """One required argument too many."""
    return 1.0


async def rollout_with_default(client, row, tries=3):
    return 1.0


@pytest.mark.parametrize("name", ["rollout", "rollout_with_default"])
def test_an_async_agent_taking_client_and_row_is_accepted(name):
    assert driver_factory(f"{__name__}.{name}") is not None


@pytest.mark.parametrize(
    ("name", "listed"),
    [("rollout_of_row", "row"), ("rollout_with_extra", "client, row, tries")],
)
def test_an_async_agent_with_another_signature_names_the_key(name, listed):
    """It was taken as an agent and called ``rollout(client, row)`` in every trajectory: a
    TypeError each time, logged per trajectory, every reward 0, and the run went on."""
    path = f"{__name__}.{name}"
    with pytest.raises(ConfigError) as info:
        driver_factory(path)
    assert str(info.value) == (
        f"generator.agent: {path} takes ({listed}): an external agent must be "
        f"`async def {name}(client, row)`"
    )
