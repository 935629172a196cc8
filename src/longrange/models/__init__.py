"""Model configs, encoders, backbone, heads, the builder and the parameter report."""
from longrange.models.config import ModelConfig
from longrange.models.model import SequenceModel, build_model, parameter_report

__all__ = ["ModelConfig", "SequenceModel", "build_model", "parameter_report"]
