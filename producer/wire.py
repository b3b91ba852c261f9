"""The building blocks every wire model shares: a frozen, closed base and strict JSON scalars.

Split from ``producer.protocol`` so the models of one concern (messages, webhooks, structure
constraints) live in modules of their own and still read the wire the same way.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# Wire numbers are strict: JSON's true is no 1 and "2" no 2, and JSON has no NaN or Infinity
# (Python's json module reads them; they would pass every range check as floats).
WireInt = Annotated[int, Field(strict=True)]
WireFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]
WireBool = Annotated[bool, Field(strict=True)]


class Frozen(BaseModel):
    """A wire model: immutable once read, and an unknown field is an error, not ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid")
