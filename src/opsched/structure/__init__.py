"""How a model is called and what it returns: the structures around a graph's flat inputs and
outputs (:mod:`.calls`, :mod:`.returns`), so that a scheduled module is called and answers
exactly as the model is and does."""

from opsched.structure.calls import ExampleInputs, FixedInput, InputStructure, bind_example, split_example
from opsched.structure.returns import OutputStructure

__all__ = ["InputStructure", "FixedInput", "OutputStructure", "ExampleInputs", "bind_example", "split_example"]
