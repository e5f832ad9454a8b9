"""Kernel-timeline analysis of torch.profiler / Kineto traces (see docs/trace-analysis.md)."""

from diagnose.trace.analyze import TraceAnalysis, analyze_trace

__all__ = ["TraceAnalysis", "analyze_trace"]
