"""The engine: cache pool, continuous-batching scheduler, request loop, offline LLM API."""
from hwinfer.engine.engine import Engine
from hwinfer.engine.llm import LLM
from hwinfer.engine.request import Request, RequestOutput, SamplingParams

__all__ = ["Engine", "LLM", "Request", "RequestOutput", "SamplingParams"]
