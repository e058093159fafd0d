"""How a model is called and what it returns: the structures around a graph's flat inputs and
outputs (:mod:`.calls`, :mod:`.returns`; :mod:`.shown` words their messages), so that a
scheduled module is called and answers exactly as the model is and does."""

from opsched.structure.calls import (
    ExampleInputs,
    FixedInput,
    InputStructure,
    bind_example,
    holds_value,
    split_example,
)
from opsched.structure.returns import OutputStructure

__all__ = ["InputStructure", "FixedInput", "OutputStructure", "ExampleInputs", "bind_example", "holds_value",
           "split_example"]
