"""The bottom layer every other one shares, torch-free: request and delta types, the one
validation of sampling parameters and prompts, and one exception type per failure kind."""

from onebit.protocol.errors import (Cancelled, ContextOverflow, InternalError, InvalidRequest, NotFound, Overloaded,
                                    RequestError, Unavailable, from_wire)
from onebit.protocol.types import GenerateRequest, Resumed, SamplingParams, StepDelta, TokenLogprob
from onebit.protocol.validate import check_n, check_prompt, check_request, check_sampling

__all__ = ["Cancelled", "ContextOverflow", "GenerateRequest", "InternalError", "InvalidRequest", "NotFound",
           "Overloaded", "RequestError", "Resumed", "SamplingParams", "StepDelta", "TokenLogprob", "Unavailable",
           "check_n", "check_prompt", "check_request", "check_sampling", "from_wire"]
