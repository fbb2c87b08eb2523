"""The shared ModelConfig and named presets (defined in kdbench.references.model_config), re-exported."""
from kdbench.references.model_config import ModelConfig, get_preset, preset_names

__all__ = ["ModelConfig", "get_preset", "preset_names"]
