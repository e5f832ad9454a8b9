"""Running a capture: the orchestration, real-time scheduling, the probes' overhead budget, the profiler window, redaction and the workload specification."""
