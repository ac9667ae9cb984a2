"""The DALLE transformer: DALLEConfig (hyper-parameters), DALLE (model, loss, generation), building blocks."""
from .config import DALLEConfig
from .dalle import DALLE, DALLEOutput

__all__ = ["DALLE", "DALLEConfig", "DALLEOutput"]
