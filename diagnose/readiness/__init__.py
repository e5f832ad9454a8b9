"""`diagnose readiness`: production-readiness checks against one server (issue 37; docs/readiness.md).

Each check drives a bounded amount of traffic to the one target given, reads the engine's own view of its work
(``/slots`` on llama.cpp, the Prometheus gauges on vLLM) and is judged against rules/thresholds.yaml into a
readiness card: pass, fail or not run, the numbers behind it and the fix to try.
"""
