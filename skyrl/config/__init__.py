"""Typed configuration: dataclass schemas, ConfigStore registration, validation."""

from skyrl.config.errors import ConfigError
from skyrl.config.root import SkyRLConfig, register_configs

__all__ = ["ConfigError", "SkyRLConfig", "register_configs"]
