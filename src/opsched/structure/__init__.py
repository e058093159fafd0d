"""How a model is called and what it returns: the structures around a graph's flat inputs and
outputs (:mod:`.calls`, :mod:`.returns`; :mod:`.fixed`, inputs fixed at a value; :mod:`.shown`,
how their messages read), so that a scheduled module is called and answers exactly as the
model is and does."""

from opsched.structure.calls import ExampleInputs, InputStructure, bind_example, split_example
from opsched.structure.fixed import FixedInput, holds_value
from opsched.structure.returns import OutputStructure

__all__ = ["InputStructure", "FixedInput", "OutputStructure", "ExampleInputs", "bind_example", "holds_value",
           "split_example"]
